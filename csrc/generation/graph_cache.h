// CUDA graphs of repeated work (decode steps, prompt passes) kept by a key that names everything
// their launches bake, so a replay never reads a buffer that has moved.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "csrc/core/check.h"

namespace warpformer {
namespace generation {

// `body`'s launches on `stream` captured as an executable graph, or null when they could not be
// (`what` names the work in the one warning). The caller marks its key failed on null, so
// neither this call nor a later one under the key tries again.
cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what);

// Graphs by Key (a struct with operator== and a `generation` field: the buffer generation the
// graph baked). At most `limit` are held, the least recently used dropped first; a lookup drops
// every graph of another generation first (they can never run again).
template <typename Key>
class GraphCache {
 public:
  struct Entry {
    Key key;
    cudaGraphExec_t exec = nullptr;
    int64_t eager_runs = 0;  // runs without a graph under this key
    bool failed = false;     // its capture failed: run eagerly
    uint64_t used = 0;
  };

  explicit GraphCache(size_t limit) : limit_(limit) {}
  ~GraphCache() {
    drop_if([](const Entry&) { return true; });
  }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The entry of `key`, added if missing.
  Entry& find_or_add(const Key& key) {
    ++clock_;
    drop_if([&](const Entry& e) { return e.key.generation != key.generation; });
    for (Entry& e : entries_) {
      if (e.key == key) {
        e.used = clock_;
        return e;
      }
    }
    if (entries_.size() >= limit_) {
      const uint64_t oldest =
          std::min_element(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
            return a.used < b.used;
          })->used;
      drop_if([&](const Entry& e) { return e.used == oldest; });
    }
    Entry e;
    e.key = key;
    e.used = clock_;
    entries_.push_back(e);
    return entries_.back();
  }

  // Destroys and removes the graphs `which` selects. (Destroying an executable graph still in
  // flight frees it when it completes.)
  template <typename Which>
  void drop_if(Which which) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (which(*it)) {
        if (it->exec != nullptr) cudaGraphExecDestroy(it->exec);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void clear() {
    drop_if([](const Entry&) { return true; });
  }
  size_t size() const { return entries_.size(); }

  // Runs `body` under entry `e`: replayed from its graph; else captured first when capture_now;
  // else eagerly (counted in eager_runs). Returns whether it was replayed.
  bool run(Entry& e, cudaStream_t stream, const std::function<void()>& body, bool capture_now,
           const char* what) {
    if (!e.failed && e.exec == nullptr && capture_now) {
      e.exec = capture_graph(stream, body, what);
      e.failed = e.exec == nullptr;
    }
    if (e.exec == nullptr) {
      body();
      if (!e.failed) ++e.eager_runs;
      return false;
    }
    WF_CUDA_CHECK(cudaGraphLaunch(e.exec, stream));
    return true;
  }

 private:
  size_t limit_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace generation
}  // namespace warpformer
