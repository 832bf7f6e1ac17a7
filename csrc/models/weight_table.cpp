#include "csrc/models/weight_table.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace warpformer {
namespace models {

std::vector<int64_t> WeightEntry::shard_shape(int64_t tp) const {
  std::vector<int64_t> s = shape;
  if (split_axis != kReplicated) {
    const int64_t nd = static_cast<int64_t>(s.size());
    s[static_cast<size_t>(split_axis < 0 ? nd + split_axis : split_axis)] /= tp;
  }
  return s;
}

std::string weight_table_json(const std::vector<WeightEntry>& table) {
  // Names, stages, dtypes, stacks and roles are the tables' own identifiers: nothing to escape.
  std::ostringstream os;
  os << "[";
  for (size_t k = 0; k < table.size(); ++k) {
    const WeightEntry& w = table[k];
    os << (k ? ", " : "") << "{\"name\": \"" << w.name << "\", \"shape\": [";
    for (size_t d = 0; d < w.shape.size(); ++d) os << (d ? ", " : "") << w.shape[d];
    os << "], \"split\": ";
    if (w.split_axis == WeightEntry::kReplicated) {
      os << "null";
    } else {
      os << w.split_axis;
    }
    os << ", \"layer\": ";
    if (w.layer < 0) {
      os << "null";
    } else {
      os << w.layer;
    }
    os << ", \"stage\": \"" << w.stage << "\", \"optional\": " << (w.optional ? "true" : "false")
       << ", \"dtype\": ";
    if (w.dtype.empty()) {
      os << "null";
    } else {
      os << "\"" << w.dtype << "\"";
    }
    os << ", \"per_rank\": " << (w.per_rank ? "true" : "false") << ", \"stack\": \"" << w.stack
       << "\", \"role\": \"" << w.role << "\"}";
  }
  os << "]";
  return os.str();
}

namespace {

const WeightEntry* find_exact(const std::vector<WeightEntry>& table, const std::string& stack,
                              int64_t layer, const std::string& role) {
  for (const WeightEntry& w : table) {
    if (w.role == role && w.stack == stack && (layer < 0 ? w.stack.empty() : w.layer == layer)) {
      return &w;
    }
  }
  return nullptr;
}

}  // namespace

const WeightEntry* find_weight(const std::vector<WeightEntry>& table, const std::string& stack,
                               int64_t layer, const std::string& role) {
  if (role.empty()) return nullptr;  // GPT-family entries have no role
  if (layer >= 0) return find_exact(table, stack, layer, role);
  if (stack.empty()) return find_exact(table, "", -1, role);
  const WeightEntry* own = find_exact(table, "", -1, stack + "_" + role);
  // A stack's embedding may be the model's shared table (T5); other roles are the stack's own.
  return own != nullptr || role != "embedding" ? own : find_exact(table, "", -1, role);
}

std::string weight_name(const std::vector<WeightEntry>& table, const std::string& stack,
                        int64_t layer, const std::string& role) {
  const WeightEntry* w = find_weight(table, stack, layer, role);
  TORCH_CHECK(w != nullptr, "weight table: no tensor of role '", role, "'",
              stack.empty() ? std::string() : " in the " + stack,
              layer >= 0 ? " layer " + std::to_string(layer) : std::string(" (model-level)"));
  return w->name;
}

}  // namespace models
}  // namespace warpformer
