// Sequential carving of one device allocation into aligned pieces, and the grow policy of
// buffers that are reused across calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace warpformer {

// Pieces of one allocation, each 256-byte aligned; a null base only measures (take returns null).
class Carver {
 public:
  static constexpr size_t kAlign = 256;
  static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + off_;
    off_ += align_up(bytes);
    return p;
  }
  template <typename T>
  T* take_n(size_t count) {
    return static_cast<T*>(take(count * sizeof(T)));
  }
  size_t used() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

// A reused buffer's new size: at least what is needed, at least 1.5x the previous size (fewer
// regrowths when calls creep upwards), at most the limit.
inline int64_t grown(int64_t need, int64_t have, int64_t limit) {
  if (need <= have) return have;
  return std::max(need, std::min(limit, have + have / 2));
}

}  // namespace warpformer
