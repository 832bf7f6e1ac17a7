// ALiBi slopes (host side), bit-compatible with HF BLOOM's _get_alibi_slopes / build_alibi_tensor.
//
// HF forms the base 2^(-2^-(log2(n) - 3)) in double, rounds it to fp32 and raises it to integer
// powers in fp32. Each power is computed here in double from the same fp32 base and rounded once,
// which is the correctly rounded value that an fp32 pow returns.
#include <cmath>
#include <vector>

#include "kernels/attention/attention.h"

namespace warpformer {
namespace kernels {

std::vector<float> alibi_slopes(int total_heads) {
  std::vector<float> slopes;
  if (total_heads <= 0) return slopes;
  slopes.reserve(static_cast<size_t>(total_heads));
  int closest = 1;  // largest power of two <= total_heads
  while (closest * 2 <= total_heads) closest *= 2;
  const double log2_closest = std::log2(static_cast<double>(closest));
  const float base = static_cast<float>(std::pow(2.0, -std::pow(2.0, -(log2_closest - 3.0))));
  for (int k = 1; k <= closest; ++k) {
    slopes.push_back(static_cast<float>(std::pow(static_cast<double>(base), k)));
  }
  if (closest != total_heads) {
    const float extra_base =
        static_cast<float>(std::pow(2.0, -std::pow(2.0, -(log2_closest + 1.0 - 3.0))));
    const int remaining = total_heads - closest;  // < closest
    for (int k = 0; k < remaining; ++k) {
      slopes.push_back(static_cast<float>(std::pow(static_cast<double>(extra_base), 2 * k + 1)));
    }
  }
  return slopes;
}

}  // namespace kernels
}  // namespace warpformer
