// A strict little JSON reader for tests that check what `kiln probe --json` writes: it rejects
// anything RFC 8259 rejects (so an escaping bug fails the test) and gives the values back.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::testing {

struct Json {
  enum Type { null, boolean, number, string, array, object } type = null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& k) const {
    auto it = fields.find(k);
    if (type != object || it == fields.end()) throw std::runtime_error("no field '" + k + "'");
    return it->second;
  }
  const Json& operator[](size_t i) const {
    if (type != array || i >= items.size()) throw std::runtime_error("no item " + std::to_string(i));
    return items[i];
  }
  bool has(const std::string& k) const { return type == object && fields.count(k) > 0; }
  size_t size() const { return type == array ? items.size() : fields.size(); }

  static Json parse(const std::string& text) {
    size_t i = 0;
    Json v = value(text, i);
    ws(text, i);
    if (i != text.size()) fail("trailing characters", i);
    return v;
  }

 private:
  [[noreturn]] static void fail(const std::string& what, size_t at) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(at));
  }
  static void ws(const std::string& t, size_t& i) {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  }
  static void expect(const std::string& t, size_t& i, const char* lit) {
    for (const char* c = lit; *c; ++c, ++i)
      if (i >= t.size() || t[i] != *c) fail(std::string("expected ") + lit, i);
  }
  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) {
      out += char(0xc0 | cp >> 6);
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xe0 | cp >> 12);
      out += char(0x80 | (cp >> 6 & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }
  static std::string str(const std::string& t, size_t& i) {
    expect(t, i, "\"");
    std::string out;
    while (true) {
      if (i >= t.size()) fail("unterminated string", i);
      unsigned char c = t[i++];
      if (c == '"') return out;
      if (c < 0x20) fail("raw control character in string", i - 1);
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (i >= t.size()) fail("bad escape", i);
      char e = t[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (i + 4 > t.size()) fail("short \\u escape", i);
          uint32_t cp = std::stoul(t.substr(i, 4), nullptr, 16);
          i += 4;
          utf8(out, cp);
          break;
        }
        default: fail("bad escape", i - 1);
      }
    }
  }
  static Json value(const std::string& t, size_t& i) {
    ws(t, i);
    if (i >= t.size()) fail("unexpected end", i);
    Json v;
    char c = t[i];
    if (c == '{') {
      v.type = object;
      ++i;
      ws(t, i);
      if (i < t.size() && t[i] == '}') {
        ++i;
        return v;
      }
      while (true) {
        ws(t, i);
        std::string k = str(t, i);
        ws(t, i);
        expect(t, i, ":");
        if (v.fields.count(k)) fail("duplicate key " + k, i);
        v.fields[k] = value(t, i);
        ws(t, i);
        if (i < t.size() && t[i] == ',') {
          ++i;
          continue;
        }
        expect(t, i, "}");
        return v;
      }
    }
    if (c == '[') {
      v.type = array;
      ++i;
      ws(t, i);
      if (i < t.size() && t[i] == ']') {
        ++i;
        return v;
      }
      while (true) {
        v.items.push_back(value(t, i));
        ws(t, i);
        if (i < t.size() && t[i] == ',') {
          ++i;
          continue;
        }
        expect(t, i, "]");
        return v;
      }
    }
    if (c == '"') {
      v.type = string;
      v.s = str(t, i);
      return v;
    }
    if (c == 't') {
      expect(t, i, "true");
      v.type = boolean;
      v.b = true;
      return v;
    }
    if (c == 'f') {
      expect(t, i, "false");
      v.type = boolean;
      return v;
    }
    if (c == 'n') {
      expect(t, i, "null");
      return v;
    }
    size_t start = i;
    if (t[i] == '-') ++i;
    while (i < t.size() &&
           ((t[i] >= '0' && t[i] <= '9') || t[i] == '.' || t[i] == 'e' || t[i] == 'E' || t[i] == '+' || t[i] == '-'))
      ++i;
    if (i == start) fail("unexpected character", i);
    v.type = number;
    v.n = std::stod(t.substr(start, i - start));
    return v;
  }
};

}  // namespace kiln::testing
