// A parser for flat JSON objects ({"key": number | string | true | false | null, ...}): the form
// in which Python hands model configs to the C++ classes (GptConfig.to_json()). Nested values are
// rejected with a message naming the key.
#pragma once

#include <initializer_list>
#include <map>
#include <string>

namespace warpformer {

struct JsonScalar {
  enum class Kind { kNull, kBool, kNumber, kString } kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;
};

class FlatJson {
 public:
  // Throws (c10::Error) with the position and the rule on malformed input.
  static FlatJson parse(const std::string& text, const char* what);

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  // Typed getters: a missing key returns the default; a present key of the wrong kind throws,
  // naming `what` and the key.
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  int64_t require_int(const std::string& key) const;
  // Throws naming `what`, the first key not in `known` and the known ones.
  void check_known(std::initializer_list<const char*> known) const;
  const std::map<std::string, JsonScalar>& values() const { return values_; }

  // The flat JSON text of `values` (keys sorted; strings escaped): what parse() reads back.
  static std::string write(const std::map<std::string, JsonScalar>& values);

 private:
  std::string what_;
  std::map<std::string, JsonScalar> values_;
};

}  // namespace warpformer
