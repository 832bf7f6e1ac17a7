#include "csrc/core/flat_json.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace warpformer {
namespace {

struct Cursor {
  const std::string& s;
  size_t i = 0;
  const char* what;

  [[noreturn]] void fail(const std::string& rule) const {
    TORCH_CHECK(false, what, ": invalid JSON at offset ", i, ": ", rule);
  }
  void skip_ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  char peek() {
    skip_ws();
    return i < s.size() ? s[i] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i;
  }
  std::string string_literal() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\') {
        if (i >= s.size()) fail("unterminated escape");
        const char e = s[i++];
        switch (e) {
          case '"':
          case '\\':
          case '/': out += e; break;
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': {
            if (i + 4 > s.size()) fail("short \\u escape");
            const long cp = std::strtol(s.substr(i, 4).c_str(), nullptr, 16);
            i += 4;
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xC0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              out += static_cast<char>(0xE0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: fail("unknown escape");
        }
      } else {
        out += c;
      }
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return out;
  }
};

}  // namespace

FlatJson FlatJson::parse(const std::string& text, const char* what) {
  FlatJson out;
  out.what_ = what;
  Cursor c{text, 0, what};
  c.expect('{');
  if (c.peek() == '}') {
    ++c.i;
  } else {
    while (true) {
      const std::string key = c.string_literal();
      c.expect(':');
      JsonScalar v;
      const char ch = c.peek();
      if (ch == '"') {
        v.kind = JsonScalar::Kind::kString;
        v.text = c.string_literal();
      } else if (text.compare(c.i, 4, "true") == 0) {
        v.kind = JsonScalar::Kind::kBool;
        v.boolean = true;
        c.i += 4;
      } else if (text.compare(c.i, 5, "false") == 0) {
        v.kind = JsonScalar::Kind::kBool;
        c.i += 5;
      } else if (text.compare(c.i, 4, "null") == 0) {
        c.i += 4;
      } else if (ch == '-' || std::isdigit(static_cast<unsigned char>(ch))) {
        const char* begin = text.c_str() + c.i;
        char* end = nullptr;
        v.kind = JsonScalar::Kind::kNumber;
        v.number = std::strtod(begin, &end);
        if (end == begin) c.fail("bad number for key '" + key + "'");
        c.i += static_cast<size_t>(end - begin);
      } else if (ch == '{' || ch == '[') {
        c.fail("value of key '" + key + "' must be a number, string or boolean, not nested");
      } else {
        c.fail("bad value for key '" + key + "'");
      }
      out.values_[key] = v;
      const char sep = c.peek();
      if (sep == ',') {
        ++c.i;
        continue;
      }
      if (sep == '}') {
        ++c.i;
        break;
      }
      c.fail("expected ',' or '}'");
    }
  }
  if (c.peek() != '\0') c.fail("trailing characters after the object");
  return out;
}

int64_t FlatJson::get_int(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.kind == JsonScalar::Kind::kNull) return def;
  const JsonScalar& v = it->second;
  if (v.kind == JsonScalar::Kind::kBool) return v.boolean ? 1 : 0;
  TORCH_CHECK(v.kind == JsonScalar::Kind::kNumber && std::floor(v.number) == v.number, what_, ": '",
              key, "' must be an integer");
  return static_cast<int64_t>(v.number);
}

double FlatJson::get_double(const std::string& key, double def) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.kind == JsonScalar::Kind::kNull) return def;
  TORCH_CHECK(it->second.kind == JsonScalar::Kind::kNumber, what_, ": '", key,
              "' must be a number");
  return it->second.number;
}

bool FlatJson::get_bool(const std::string& key, bool def) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.kind == JsonScalar::Kind::kNull) return def;
  const JsonScalar& v = it->second;
  if (v.kind == JsonScalar::Kind::kNumber && (v.number == 0 || v.number == 1)) {
    return v.number == 1;
  }
  TORCH_CHECK(v.kind == JsonScalar::Kind::kBool, what_, ": '", key, "' must be a boolean");
  return v.boolean;
}

std::string FlatJson::get_string(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.kind == JsonScalar::Kind::kNull) return def;
  TORCH_CHECK(it->second.kind == JsonScalar::Kind::kString, what_, ": '", key,
              "' must be a string");
  return it->second.text;
}

int64_t FlatJson::require_int(const std::string& key) const {
  TORCH_CHECK(has(key), what_, ": required key '", key, "' is missing");
  return get_int(key, 0);
}

void FlatJson::check_known(std::initializer_list<const char*> known) const {
  for (const auto& kv : values_) {
    bool found = false;
    for (const char* k : known) found = found || kv.first == k;
    if (found) continue;
    std::string list;
    for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    TORCH_CHECK(false, what_, ": unknown key '", kv.first, "'; known keys: ", list);
  }
}

std::string FlatJson::write(const std::map<std::string, JsonScalar>& values) {
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        static const char* const kHex = "0123456789abcdef";
        out += "\\u00";
        out += kHex[(c >> 4) & 0xF];
        out += kHex[c & 0xF];
      } else {
        out += c;
      }
    }
    return out + "\"";
  };
  std::string out = "{";
  for (const auto& [key, v] : values) {
    if (out.size() > 1) out += ", ";
    out += quoted(key) + ": ";
    switch (v.kind) {
      case JsonScalar::Kind::kNull: out += "null"; break;
      case JsonScalar::Kind::kBool: out += v.boolean ? "true" : "false"; break;
      case JsonScalar::Kind::kString: out += quoted(v.text); break;
      case JsonScalar::Kind::kNumber: {
        std::ostringstream os;
        os.precision(17);
        os << v.number;
        out += os.str();
        break;
      }
    }
  }
  return out + "}";
}

}  // namespace warpformer
