// TrainingArguments: defaults < TOML file < environment, with errors that name file, line and key.
//
// One table (table() below) names every setting once: its key, which is its TOML path and its
// field's path; its environment variable; how a TOML value and an environment value become the
// field; and the check every value passes however it was set. Parsing files, applying the
// environment, validate() and the docs' test all walk that table.
#include "kiln/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "kiln/internal/selection.h"

namespace kiln {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

SettingOrigin at(const toml::source_region& r, const std::string& source) {
  return {source, static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
}
SettingOrigin origin_of(const toml::node& n, const std::string& source) { return at(n.source(), source); }

SettingOrigin env_origin(const std::string& var) { return {"environment (" + var + ")", 0, 0}; }

// The code point of the UTF-8 sequence at text[i] and its length in bytes; nullopt where it is not one.
std::optional<std::pair<uint32_t, size_t>> decode_utf8(const std::string& text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(i);
  const size_t len = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  uint32_t cp = len == 4 ? c & 0x07u : len == 3 ? c & 0x0Fu : c & 0x1Fu;
  if (len == 0 || i + len > text.size()) return std::nullopt;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b(i + k) & 0x3Fu);
  }
  return std::make_pair(cp, len);
}

// "U+00E9" for the UTF-8 sequence at text[i], or "byte 0xC3" where it is not one.
std::string code_point_at(const std::string& text, size_t i) {
  char buf[32];
  if (const auto d = decode_utf8(text, i)) std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(d->first));
  else std::snprintf(buf, sizeof buf, "byte 0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[i])));
  return buf;
}

// Whether Debian 12's TOML++ (3.3) reaches __builtin_unreachable - undefined behaviour - testing
// code point c for whitespace. Its generated table splits U+00A0..U+FEFF into 64 blocks of 0x3FA
// and handles only some: the rest of blocks 0, 11 and 63 (U+00A1..U+0499, U+2C5E..U+3057 but
// U+3000, U+FB26..U+FEFE) fall through to the unreachable default.
bool tomlpp_whitespace_test_is_undefined(uint32_t c) {
  if (c <= 0xA0 || c >= 0xFEFF || c == 0x3000) return false;
  const uint64_t block = (c - 0xA0) / 0x3FA;
  return block == 0 || block == 11 || block == 63;
}

// The characters outside ASCII that TOML++ 3.3 takes for horizontal whitespace.
bool tomlpp_non_ascii_whitespace(uint32_t c) {
  return c == 0xA0 || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200B) || c == 0x202F ||
         (c >= 0x205F && c <= 0x2060) || c == 0x3000 || c == 0xFEFF;
}

// The text TOML++ is given. TOML allows characters outside ASCII only in strings and comments.
// Debian 12's TOML++ (3.3) tests some of them for whitespace where undefined behaviour follows
// (tomlpp_whitespace_test_is_undefined; found by fuzzing the configuration): at every token
// boundary, after a backslash in a multi-line basic string, and at the first character after a
// line-ending backslash. So kiln refuses every one of them outside strings and comments and after
// a backslash (none is valid TOML there), saying where; the one valid place, after a line-ending
// backslash, it writes as the \uXXXX escape that means the same character.
std::string guard_toml_text(const std::string& text, const std::string& source) {
  std::vector<std::pair<size_t, std::pair<uint32_t, size_t>>> escapes;  // offset, (code point, bytes)
  enum class In { Plain, Comment, Basic, Literal, MultiBasic, MultiLiteral };
  In in = In::Plain;
  // A quote opens a string only where TOML has one: a key (a line's start, after '.', '[', '{' or
  // ',') or a value (after '=', '[' or ','). Elsewhere (`00Z07"...`, a bad date, `1.'''`) it is junk
  // that the parser reads on as part of a value, so what follows it is not a string's. A '.' is a
  // key's only on the key side of a line (before its '=', or in an inline table before each '=').
  // Where in doubt the text counts as outside a string: a valid file never needs the doubt
  // resolved the other way.
  char last = '\n';  // the last character outside strings other than a space or tab
  bool key_side = true;
  bool bare = false;  // in the text of a value that is not a string, array or table
  std::string open;   // the '[' and '{' opened on the value side, innermost last
  int line = 1, column = 1;
  size_t i = 0;
  // Moves past n bytes, counting lines and columns (a column per character, not per byte).
  auto advance = [&](size_t n) {
    for (size_t end = std::min(text.size(), i + n); i < end; ++i) {
      if (text[i] == '\n') ++line, column = 1;
      else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++column;
    }
  };
  auto at = [&](const char* s) { return text.compare(i, std::char_traits<char>::length(s), s) == 0; };
  // A date followed by a space and a digit (`1979-05-27 0`) may be a date-time with a space for its
  // 'T': the parser then reads on past the digit without testing the next character for the end of
  // the value, so a '#' right after that digit is read as more of the value, not as a comment's
  // start, and what follows it is tested as value text. The date is the bare value's text before the
  // space, judged as the parser judges it: ten characters not counting '_', a digit first and '-'
  // fifth and eighth (whatever the others are: the parser's scan takes '=' and quotes too).
  size_t run_from = std::string::npos;                                    // where the bare value's text began
  std::pair<size_t, size_t> ended{std::string::npos, std::string::npos};  // the last one a space ended
  auto hash_continues_date_time = [&] {
    if (i < 2 || run_from != i - 1 || !std::isdigit(static_cast<unsigned char>(text[i - 1])) || text[i - 2] != ' ' ||
        ended.second != i - 2)
      return false;
    std::string date;
    for (size_t k = ended.first; k < ended.second; ++k)
      if (text[k] != '_') date += text[k];
    return date.size() == 10 && std::isdigit(static_cast<unsigned char>(date[0])) && date[4] == '-' && date[7] == '-';
  };
  // A multi-line string closes at its last three of up to five quotes.
  auto close_run = [&](char q) {
    size_t n = 0;
    while (i + n < text.size() && text[i + n] == q && n < 5) ++n;
    advance(n);
    in = In::Plain;
  };
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (in) {
      case In::Plain:
        if (c >= 0x80)
          throw ConfigError({source, line, column}, "",
                            "TOML syntax error: " + code_point_at(text, i) +
                                " outside a string or comment (TOML allows only ASCII there; quote the value)");
        if (c == '#' && !(bare && hash_continues_date_time())) {
          in = In::Comment, bare = false;
        } else if (c == '\n' || c == ' ' || c == '\t') {
          if (c == '\n') last = '\n', key_side = key_side || open.empty();
          if (bare) ended = {run_from, i};
          bare = false;
        } else if (bare && std::string_view("]},").find(static_cast<char>(c)) == std::string_view::npos) {
          last = static_cast<char>(c);  // more of a value's text, quotes and brackets included
        } else if ((c == '"' || c == '\'') &&
                   (std::string_view("\n[{,=").find(last) != std::string_view::npos || (last == '.' && key_side))) {
          // Three quotes open a multi-line string on a key's side too: the parser reads the whole
          // string before it says that a key cannot be one.
          if (at("\"\"\"")) in = In::MultiBasic, advance(2);
          else if (at("'''")) in = In::MultiLiteral, advance(2);
          else in = c == '"' ? In::Basic : In::Literal;
          last = static_cast<char>(c);
        } else {
          bare = false;
          if (c == '=') key_side = false;
          // A '[' on the key side of a line with nothing open is a table header, not an array.
          else if ((c == '[' || c == '{') && !(c == '[' && key_side && open.empty())) open += static_cast<char>(c);
          else if ((c == ']' || c == '}') && !open.empty()) open.pop_back();
          if (c == '{' || (c == ',' && !open.empty() && open.back() == '{')) key_side = true;
          // A value that is not a string, array or table (a number, date, boolean): the parser reads
          // on to the next space, ']', '}', ',' or '#' before it judges it.
          bare = !key_side && std::string_view("[]{},=\"'").find(static_cast<char>(c)) == std::string_view::npos;
          if (bare) run_from = i;
          last = static_cast<char>(c);
        }
        break;
      case In::Comment:
        if (c == '\n') {
          in = In::Plain, last = '\n';
          if (open.empty()) key_side = true;
        }
        break;
      case In::Basic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') advance(1);  // an escape: skip its next byte
        else if (c == '"') in = In::Plain;
        else if (c == '\n') in = In::Plain, last = '\n', key_side = key_side || open.empty();  // unterminated
        break;
      case In::Literal:
        if (c == '\'') in = In::Plain;
        else if (c == '\n') in = In::Plain, last = '\n', key_side = key_side || open.empty();
        break;
      case In::MultiBasic:
        if (c == '\\') {
          size_t k = i + 1;
          while (k < text.size() && (text[k] == ' ' || text[k] == '\t')) ++k;
          if (k < text.size() && static_cast<unsigned char>(text[k]) >= 0x80) {
            const bool escape = k == i + 1;
            advance(k - i);
            throw ConfigError({source, line, column}, "",
                              "TOML syntax error: " + code_point_at(text, i) +
                                  (escape ? " after a backslash is not an escape"
                                          : " after a backslash and spaces (a line-ending backslash must be the last "
                                            "character on its line)"));
          }
          if (k < text.size() && (text[k] == '\n' || text[k] == '\r')) {
            // A line-ending backslash: the parser skips line breaks and what it takes for horizontal
            // whitespace (U+FEFF and U+00A0 among them), testing each character, up to the first
            // that is neither.
            while (k < text.size()) {
              if (text[k] == ' ' || text[k] == '\t' || (text[k] >= '\n' && text[k] <= '\r')) {
                ++k;
                continue;
              }
              if (static_cast<unsigned char>(text[k]) >= 0x80) {
                const auto d = decode_utf8(text, k);
                if (d && tomlpp_non_ascii_whitespace(d->first)) {
                  k += d->second;
                  continue;
                }
                if (d && tomlpp_whitespace_test_is_undefined(d->first)) escapes.push_back({k, *d});
              }
              break;
            }
            advance(k - i);
            continue;
          }
          if (i + 1 < text.size()) advance(1);  // an escape: skip its next byte
        } else if (at("\"\"\"")) {
          close_run('"');
          continue;
        }
        break;
      case In::MultiLiteral:
        if (at("'''")) {
          close_run('\'');
          continue;
        }
        break;
    }
    advance(1);
  }
  if (escapes.empty()) return text;
  std::string out;
  size_t from = 0;
  for (const auto& [offset, d] : escapes) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(d.first));
    out.append(text, from, offset - from).append(buf);
    from = offset + d.second;
  }
  return out.append(text, from, std::string::npos);
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

// "a string", "an integer", "an array": for messages.
std::string a_type(const toml::node& n) {
  std::string t = type_name(n);
  return (t[0] == 'a' || t[0] == 'i' ? "an " : "a ") + t;
}

ConfigError wrong_type(const toml::node& n, const std::string& source, const std::string& key, const char* want) {
  return ConfigError(origin_of(n, source), key,
                     "key '" + key + "' must be " + std::string(want) + ", not " + a_type(n));
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// The shortest text that reads back as `d` ("5e-05", not "5.0000000000000002e-05").
std::string number_text(double d) {
  for (int precision = 1;; ++precision) {
    std::ostringstream os;
    os.precision(precision);
    os << d;
    if (precision >= 17 || std::strtod(os.str().c_str(), nullptr) == d) return os.str();
  }
}

std::string scalar_to_string(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) return number_text(f->get());
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  return {};
}

// The one boolean syntax of every environment variable.
bool env_bool(const std::string& text, const SettingOrigin& where, const std::string& key) {
  std::string t = text;
  for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "true" || t == "on" || t == "yes") return true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return false;
  throw ConfigError(where, key, "'" + text + "' is not a boolean; use 1/0, true/false, on/off or yes/no");
}

int64_t env_integer(const std::string& text, const SettingOrigin& where, const std::string& key) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw ConfigError(where, key, "'" + text + "' is not an integer");
  return v;
}

double env_number(const std::string& text, const SettingOrigin& where, const std::string& key) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size())
    throw ConfigError(where, key, "'" + text + "' is not a number");
  return v;
}

const std::vector<std::string>& log_levels() {
  static const std::vector<std::string> l = {"trace", "debug",    "info", "warning", "warn",
                                             "error", "critical", "off",  "passive"};
  return l;
}

void check_mode(const std::string& mode, const SettingOrigin& where, const std::string& key) {
  const auto& modes = valid_modes();
  if (std::find(modes.begin(), modes.end(), mode) != modes.end()) return;
  std::string msg = "unknown mode '" + mode + "'";
  if (auto near = nearest_name(mode, modes)) msg += "; did you mean '" + *near + "'? Valid modes: ";
  else msg += "; valid modes: ";
  msg += join(modes);
  throw ConfigError(where, key, msg);
}

void check_log_level(const std::string& level, const SettingOrigin& where, const std::string& key) {
  const auto& levels = log_levels();
  if (std::find(levels.begin(), levels.end(), level) != levels.end()) return;
  std::string msg = "unknown log level '" + level + "'";
  if (auto near = nearest_name(level, levels)) msg += "; did you mean '" + *near + "'? Valid levels: ";
  else msg += "; valid levels: ";
  throw ConfigError(where, key, msg + join(levels));
}

void check_not_empty(const std::string& value, const SettingOrigin& where, const std::string& key,
                     const char* hint = "") {
  if (value.empty()) throw ConfigError(where, key, "key '" + key + "' must not be empty" + hint);
}

// ---- the table ----------------------------------------------------------------------------------

struct Setting {
  Setting(std::string key, std::string env) : key(std::move(key)), env(std::move(env)) {}
  std::string key;
  std::string env;          // empty: no environment variable
  std::string default_doc;  // empty: the value of a default TrainingArguments, as TOML text
  // A TOML value (the key's node; for plugin options the whole [plugin] table) into the field.
  std::function<void(TrainingArguments&, const toml::node&, const std::string& source)> from_toml;
  // An environment value (never empty) into the field.
  std::function<void(TrainingArguments&, const std::string&, const SettingOrigin&)> from_env;
  // The field as TOML text.
  std::function<std::string(const TrainingArguments&)> show;
  // What every value must satisfy, set in code too.
  std::function<void(const TrainingArguments&, const SettingOrigin&)> check;
};

// `field` is a generic lambda returning a reference to the field, for const and non-const arguments.
template <class F>
Setting flag(std::string key, std::string env, F field) {
  Setting s{key, env};
  s.from_toml = [key, field](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_boolean()) throw wrong_type(v, source, key, "a boolean");
    field(a) = v.as_boolean()->get();
  };
  s.from_env = [key, field](TrainingArguments& a, const std::string& text, const SettingOrigin& where) {
    field(a) = env_bool(text, where, key);
  };
  s.show = [field](const TrainingArguments& a) { return std::string(field(a) ? "true" : "false"); };
  return s;
}

// Whole numbers within [lo, hi], which the field's type must hold.
template <class F>
Setting integer(std::string key, std::string env, F field, int64_t lo, int64_t hi) {
  Setting s{key, env};
  auto in_range = [key, lo, hi](int64_t n, const SettingOrigin& where) {
    if (n < lo || n > hi)
      throw ConfigError(where, key,
                        "key '" + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                            ", got " + std::to_string(n));
    return n;
  };
  s.from_toml = [key, field, in_range](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_integer()) throw wrong_type(v, source, key, "an integer");
    // Checked before the assignment, so that a value the field cannot hold is reported, not truncated.
    field(a) = static_cast<std::decay_t<decltype(field(a))>>(in_range(v.as_integer()->get(), origin_of(v, source)));
  };
  s.from_env = [key, field, in_range](TrainingArguments& a, const std::string& text, const SettingOrigin& where) {
    field(a) = static_cast<std::decay_t<decltype(field(a))>>(in_range(env_integer(text, where, key), where));
  };
  s.show = [field](const TrainingArguments& a) { return std::to_string(field(a)); };
  s.check = [field, in_range](const TrainingArguments& a, const SettingOrigin& where) { in_range(field(a), where); };
  return s;
}

template <class F>
Setting text(std::string key, std::string env, F field,
             std::function<void(const std::string&, const SettingOrigin&, const std::string&)> check = {}) {
  Setting s{key, env};
  s.from_toml = [key, field](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_string()) throw wrong_type(v, source, key, "a string");
    field(a) = v.as_string()->get();
  };
  s.from_env = [field](TrainingArguments& a, const std::string& value, const SettingOrigin&) { field(a) = value; };
  s.show = [field](const TrainingArguments& a) { return quoted(field(a)); };
  if (check)
    s.check = [key, field, check](const TrainingArguments& a, const SettingOrigin& where) {
      check(field(a), where, key);
    };
  return s;
}

// Naming a backend or a mode turns torch_compile on (Hugging Face), in the file and the environment.
Setting turns_compile_on(Setting s) {
  auto from_toml = s.from_toml;
  auto from_env = s.from_env;
  s.from_toml = [from_toml](TrainingArguments& a, const toml::node& v, const std::string& source) {
    from_toml(a, v, source);
    a.torch_compile = true;
  };
  s.from_env = [from_env](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    from_env(a, value, where);
    a.torch_compile = true;
  };
  return s;
}

Setting max_grad_norm_setting() {
  const std::string key = "max_grad_norm";
  Setting s{key, ""};
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_number()) throw wrong_type(v, source, key, "a number");
    a.max_grad_norm = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
  };
  s.from_env = [key](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    a.max_grad_norm = env_number(value, where, key);
  };
  s.show = [](const TrainingArguments& a) { return number_text(a.max_grad_norm); };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    if (!(a.max_grad_norm >= 0) || !std::isfinite(a.max_grad_norm))
      throw ConfigError(
          where, key,
          "key '" + key + "' must be a finite number >= 0 (0 turns clipping off), got " + number_text(a.max_grad_norm));
  };
  return s;
}

// learning_rate: a number >= 0 when set; unset, train() keeps the optimizer's own rates.
Setting learning_rate_setting() {
  const std::string key = "learning_rate";
  Setting s{key, ""};
  s.default_doc = "unset";
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_number()) throw wrong_type(v, source, key, "a number");
    a.learning_rate = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
  };
  s.from_env = [key](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    a.learning_rate = env_number(value, where, key);
  };
  s.show = [](const TrainingArguments& a) { return a.learning_rate ? number_text(*a.learning_rate) : "unset"; };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    if (a.learning_rate && (!(*a.learning_rate >= 0 && *a.learning_rate <= 1e9) || !std::isfinite(*a.learning_rate)))
      throw ConfigError(where, key,
                        "key '" + key + "' must be a finite number >= 0 (or unset: the optimizer's own rates), got " +
                            number_text(*a.learning_rate));
  };
  return s;
}

// A floating-point number within [lo, hi] (TOML integers are accepted too); `what` says the range in
// the error message.
template <class F>
Setting real(std::string key, F field, double lo, double hi, std::string what) {
  Setting s{key, ""};
  s.from_toml = [key, field](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_number()) throw wrong_type(v, source, key, "a number");
    field(a) = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
  };
  s.from_env = [key, field](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    field(a) = env_number(value, where, key);
  };
  s.show = [field](const TrainingArguments& a) { return number_text(field(a)); };
  s.check = [key, field, lo, hi, what](const TrainingArguments& a, const SettingOrigin& where) {
    const double d = field(a);
    if (!(d >= lo && d <= hi) || !std::isfinite(d))
      throw ConfigError(where, key, "key '" + key + "' must be " + what + ", got " + number_text(d));
  };
  return s;
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t);

// logging_steps, eval_steps, save_steps: a whole number of optimizer steps from 1, or a ratio of
// the total steps in (0, 1) (Hugging Face's); `zero_means` says what 0 is, or "" when 0 is refused.
template <class F>
Setting steps_setting(std::string key, F field, std::string zero_means = "") {
  Setting s{key, ""};
  s.from_toml = [key, field](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_number()) throw wrong_type(v, source, key, "a number");
    field(a) = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
  };
  s.from_env = [key, field](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    field(a) = env_number(value, where, key);
  };
  s.show = [field](const TrainingArguments& a) {
    const double d = field(a);
    return d >= 1 && d == std::floor(d) ? std::to_string(static_cast<int64_t>(d)) : number_text(d);
  };
  s.check = [key, field, zero_means](const TrainingArguments& a, const SettingOrigin& where) {
    const double d = field(a);
    const bool ok = std::isfinite(d) && d <= 1e12 &&
                    ((d >= 1 && d == std::floor(d)) || (d > 0 && d < 1) || (d == 0 && !zero_means.empty()));
    if (!ok)
      throw ConfigError(where, key,
                        "key '" + key +
                            "' must be a whole number of steps from 1, or a ratio of the total steps "
                            "between 0 and 1 (0.1: every tenth of the run)" +
                            (zero_means.empty() ? "" : "; 0 " + zero_means) + ", got " + number_text(d));
  };
  return s;
}

// data_seed: a seed from 0 when set; unset, the shuffling follows seed.
Setting data_seed_setting() {
  const std::string key = "data_seed";
  Setting s{key, ""};
  s.default_doc = "unset";
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_integer()) throw wrong_type(v, source, key, "an integer");
    a.data_seed = v.as_integer()->get();
  };
  s.from_env = [key](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    a.data_seed = env_integer(value, where, key);
  };
  s.show = [](const TrainingArguments& a) { return a.data_seed ? std::to_string(*a.data_seed) : "unset"; };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    if (a.data_seed && (*a.data_seed < 0 || *a.data_seed > (int64_t{1} << 62)))
      throw ConfigError(where, key,
                        "key '" + key + "' must be between 0 and " + std::to_string(int64_t{1} << 62) +
                            " (or unset: " + "seed), got " + std::to_string(*a.data_seed));
  };
  return s;
}

// greater_is_better: a boolean when set; unset, the metric's name decides (Hugging Face's).
Setting greater_is_better_setting() {
  const std::string key = "greater_is_better";
  Setting s{key, ""};
  s.default_doc = "unset";
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_boolean()) throw wrong_type(v, source, key, "a boolean");
    a.greater_is_better = v.as_boolean()->get();
  };
  s.from_env = [key](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    if (value != "true" && value != "false")
      throw ConfigError(where, key, "key '" + key + "' must be true or false, got '" + value + "'");
    a.greater_is_better = value == "true";
  };
  s.show = [](const TrainingArguments& a) {
    return a.greater_is_better ? std::string(*a.greater_is_better ? "true" : "false") : std::string("unset");
  };
  return s;
}

// [lr_scheduler_kwargs]: the schedule's arguments by Hugging Face's names, kept as text (numbers
// and names); lr_scheduler_kwargs_check says which a schedule takes.
Setting lr_scheduler_kwargs_setting() {
  const std::string key = "lr_scheduler_kwargs";
  Setting s{key, ""};
  s.default_doc = "{}";
  s.from_toml = [key](TrainingArguments& a, const toml::node& node, const std::string& source) {
    if (!node.is_table()) throw wrong_type(node, source, key, "a table");
    for (const auto& [k_, v_] : in_file_order(*node.as_table())) {
      const toml::node& v = *v_;
      const std::string full = key + "." + std::string(k_->str());
      if (!(v.is_string() || v.is_integer() || v.is_floating_point()))
        throw ConfigError(origin_of(v, source), full,
                          "key '" + full + "' must be a number or a string, not " + a_type(v));
      a.lr_scheduler_kwargs[std::string(k_->str())] = scalar_to_string(v);
      a.origins[full] = origin_of(v, source);
    }
  };
  s.show = [](const TrainingArguments&) { return std::string("{}"); };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    static const std::map<std::string, std::vector<std::string>> takes = {
        {"constant", {}},
        {"constant_with_warmup", {}},
        {"linear", {}},
        {"cosine", {"num_cycles"}},
        {"cosine_with_restarts", {"num_cycles"}},
        {"polynomial", {"lr_end", "power"}},
        {"inverse_sqrt", {"timescale"}},
        {"cosine_with_min_lr", {"num_cycles", "min_lr", "min_lr_rate"}},
        {"warmup_stable_decay", {"num_stable_steps", "num_decay_steps", "min_lr_ratio", "num_cycles", "decay_type"}},
        {"reduce_lr_on_plateau",
         {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"}}};
    const auto t = takes.find(a.lr_scheduler_type);
    if (t == takes.end()) return;  // lr_scheduler_type's own check names it
    for (const auto& [k, v] : a.lr_scheduler_kwargs) {
      const std::string full = key + "." + k;
      const auto at = a.origins.count(full) ? a.origins.at(full) : where;
      if (std::find(t->second.begin(), t->second.end(), k) == t->second.end())
        throw ConfigError(at, full,
                          "lr_scheduler_type '" + a.lr_scheduler_type + "' takes " +
                              (t->second.empty() ? std::string("no arguments") : "only " + join(t->second)) +
                              ", not '" + k + "'");
      if (k == "decay_type" || k == "mode" || k == "threshold_mode") {
        const std::vector<std::string> valid = k == "decay_type"
                                                   ? std::vector<std::string>{"cosine", "linear", "1-sqrt"}
                                               : k == "mode" ? std::vector<std::string>{"min", "max"}
                                                             : std::vector<std::string>{"rel", "abs"};
        if (std::find(valid.begin(), valid.end(), v) == valid.end())
          throw ConfigError(at, full, "key '" + full + "' is '" + v + "'; valid values: " + join(valid));
        continue;
      }
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(d) || d < 0)
        throw ConfigError(at, full, "key '" + full + "' must be a number >= 0, got '" + v + "'");
      if (a.lr_scheduler_type == "reduce_lr_on_plateau") {
        if (k == "factor" && d >= 1)
          throw ConfigError(at, full, "key '" + full + "' must be below 1 (it multiplies the rate), got '" + v + "'");
        if ((k == "patience" || k == "cooldown") && d != std::floor(d))
          throw ConfigError(at, full, "key '" + full + "' must be a whole number of evaluations, got '" + v + "'");
      }
    }
    if (a.lr_scheduler_type == "reduce_lr_on_plateau" && a.eval_strategy == "no")
      throw ConfigError(where, "lr_scheduler_type",
                        "lr_scheduler_type 'reduce_lr_on_plateau' steps on evaluations and eval_strategy is 'no' "
                        "(Hugging Face's rule): set eval_strategy to \"steps\" or \"epoch\"");
    if (a.lr_scheduler_type == "cosine_with_min_lr" &&
        a.lr_scheduler_kwargs.count("min_lr") == a.lr_scheduler_kwargs.count("min_lr_rate"))
      throw ConfigError(where, key,
                        "lr_scheduler_type 'cosine_with_min_lr' needs exactly one of min_lr and min_lr_rate in "
                        "[lr_scheduler_kwargs] (Hugging Face's rule)");
    if (a.lr_scheduler_type == "warmup_stable_decay" && !a.lr_scheduler_kwargs.count("num_decay_steps"))
      throw ConfigError(where, key,
                        "lr_scheduler_type 'warmup_stable_decay' needs num_decay_steps in [lr_scheduler_kwargs]");
  };
  return s;
}

// The optimizers a Trainer makes (Hugging Face's names for LibTorch's optimizers), and Hugging
// Face's others, which LibTorch does not have.
const std::vector<std::string>& optim_names() {
  static const std::vector<std::string> n = {"adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop"};
  return n;
}

void check_optim(const std::string& name, const SettingOrigin& where, const std::string& key) {
  const auto& names = optim_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  static const std::vector<std::string> elsewhere = {
      "adamw_hf",     "adamw_apex_fused", "adafactor",   "adamw_anyprecision",  "adamw_bnb_8bit",
      "adamw_8bit",   "paged_adamw_8bit", "lion_8bit",   "lion_32bit",          "paged_lion_8bit",
      "galore_adamw", "adalomo",          "lomo",        "schedule_free_adamw", "grokadamw",
      "ademamix",     "apollo_adamw",     "stable_adamw"};
  const bool hf = std::find(elsewhere.begin(), elsewhere.end(), name) != elsewhere.end() ||
                  name.rfind("adamw_torch_", 0) == 0 || name.rfind("galore_", 0) == 0;
  throw ConfigError(
      where, key,
      "key '" + key + "' is '" + name + "'" +
          (hf ? ", a Hugging Face optimizer that LibTorch does not have" : ", not an optimizer kiln knows") +
          "; a Trainer makes one of " + join(names) + ", or make the optimizer yourself and hand it to the Trainer");
}

const std::vector<std::string>& lr_scheduler_types() {
  static const std::vector<std::string> t = {"constant",
                                             "constant_with_warmup",
                                             "linear",
                                             "cosine",
                                             "cosine_with_restarts",
                                             "polynomial",
                                             "inverse_sqrt",
                                             "cosine_with_min_lr",
                                             "warmup_stable_decay",
                                             "reduce_lr_on_plateau"};
  return t;
}

void check_lr_scheduler_type(const std::string& type, const SettingOrigin& where, const std::string& key) {
  const auto& types = lr_scheduler_types();
  if (std::find(types.begin(), types.end(), type) != types.end()) return;
  std::string msg = "unknown lr_scheduler_type '" + type + "'";
  if (auto near = nearest_name(type, types)) msg += "; did you mean '" + *near + "'? Valid types: ";
  else msg += "; valid types: ";
  throw ConfigError(where, key, msg + join(types));
}

// A check that the value is one of `valid` (`what` names the setting's values in the message).
std::function<void(const std::string&, const SettingOrigin&, const std::string&)> one_of(std::vector<std::string> valid,
                                                                                         std::string what) {
  return [valid, what](const std::string& value, const SettingOrigin& where, const std::string& key) {
    if (std::find(valid.begin(), valid.end(), value) != valid.end()) return;
    std::string msg = "unknown " + what + " '" + value + "'";
    if (auto near = nearest_name(value, valid)) msg += "; did you mean '" + *near + "'? Valid values: ";
    else msg += "; valid values: ";
    throw ConfigError(where, key, msg + join(valid));
  };
}

const std::vector<std::string>& report_to_values() {
  static const std::vector<std::string> v = {"all", "jsonl", "none"};
  return v;
}

// report_to: a string or an array of strings, each one of report_to_values(); "none" stands alone.
Setting report_to_setting() {
  const std::string key = "report_to";
  Setting s{key, ""};
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (v.is_string()) {
      a.report_to = {v.as_string()->get()};
      return;
    }
    if (!v.is_array()) throw wrong_type(v, source, key, "a string or an array of strings");
    std::vector<std::string> values;
    for (const auto& e : *v.as_array()) {
      if (!e.is_string())
        throw ConfigError(origin_of(e, source), key, "every entry of '" + key + "' must be a string, not " + a_type(e));
      values.push_back(e.as_string()->get());
    }
    a.report_to = std::move(values);
  };
  s.show = [](const TrainingArguments& a) {
    std::vector<std::string> q;
    for (const auto& d : a.report_to) q.push_back(quoted(d));
    return "[" + join(q) + "]";
  };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    const auto check = one_of(report_to_values(), "report_to value");
    for (const auto& r : a.report_to) check(r, where, key);
    if (a.report_to.size() > 1 && std::find(a.report_to.begin(), a.report_to.end(), "none") != a.report_to.end())
      throw ConfigError(where, key,
                        "report_to 'none' cannot be combined with other values, got [" + join(a.report_to) + "]");
  };
  return s;
}

// resume_from_checkpoint: a path, "true"/"last", or "" (none); in a file also a boolean.
Setting resume_setting() {
  Setting s = text(
      "resume_from_checkpoint", "", [](auto& a) -> auto& { return a.resume_from_checkpoint; });
  const std::string key = s.key;
  auto from_string = s.from_toml;
  s.from_toml = [key, from_string](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (v.is_boolean()) a.resume_from_checkpoint = v.as_boolean()->get() ? "true" : "";
    else if (v.is_string()) from_string(a, v, source);
    else throw wrong_type(v, source, key, "a string (a checkpoint folder, \"true\" or \"last\") or a boolean");
  };
  return s;
}

// runtime.mark_dynamic: an array of "input:dim" (both non-negative integers).
Setting mark_dynamic_setting() {
  const std::string key = "runtime.mark_dynamic";
  Setting s{key, ""};
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_array()) throw wrong_type(v, source, key, "an array of strings \"input:dim\"");
    std::vector<std::string> values;
    for (const auto& e : *v.as_array()) {
      if (!e.is_string())
        throw ConfigError(origin_of(e, source), key, "every entry of '" + key + "' must be a string, not " + a_type(e));
      values.push_back(e.as_string()->get());
    }
    a.runtime.mark_dynamic = std::move(values);
  };
  s.show = [](const TrainingArguments& a) {
    std::vector<std::string> q;
    for (const auto& d : a.runtime.mark_dynamic) q.push_back(quoted(d));
    return "[" + join(q) + "]";
  };
  s.check = [key](const TrainingArguments& a, const SettingOrigin& where) {
    for (const auto& m : a.runtime.mark_dynamic) {
      const auto colon = m.find(':');
      auto digits = [](const std::string& t) {
        return !t.empty() && t.size() < 7 &&
               std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
      };
      if (colon == std::string::npos || !digits(m.substr(0, colon)) || !digits(m.substr(colon + 1)))
        throw ConfigError(where, key,
                          "'" + m + "' is not \"input:dim\" (the step's input index and a dimension, e.g. \"0:1\")");
    }
  };
  return s;
}

// runtime.dynamic: "auto", "true" or "false"; in a file also a boolean.
Setting dynamic_setting() {
  Setting s = text(
      "runtime.dynamic", "KILN_DYNAMIC", [](auto& a) -> auto& { return a.runtime.dynamic; },
      one_of({"auto", "true", "false"}, "runtime.dynamic"));
  const std::string key = s.key;
  auto from_string = s.from_toml;
  s.from_toml = [key, from_string](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (v.is_boolean()) a.runtime.dynamic = v.as_boolean()->get() ? "true" : "false";
    else if (v.is_string()) from_string(a, v, source);
    else throw wrong_type(v, source, key, "\"auto\", true or false");
  };
  return s;
}

// The file's list replaces the code's; KILN_PLUGIN_PATH's directories go before it. Entries that
// repeat an earlier one are dropped, so applying the environment twice is applying it once.
Setting plugin_dirs_setting() {
  const std::string key = "runtime.plugin_dirs";
  Setting s{key, "KILN_PLUGIN_PATH"};
  s.from_toml = [key](TrainingArguments& a, const toml::node& v, const std::string& source) {
    if (!v.is_array()) throw wrong_type(v, source, key, "an array of strings");
    std::vector<std::string> dirs;
    for (const auto& e : *v.as_array()) {
      if (!e.is_string())
        throw ConfigError(origin_of(e, source), key, "every entry of '" + key + "' must be a string, not " + a_type(e));
      dirs.push_back(e.as_string()->get());
    }
    a.runtime.plugin_dirs = std::move(dirs);
  };
  s.from_env = [](TrainingArguments& a, const std::string& value, const SettingOrigin&) {
    std::vector<std::string> dirs;
    std::stringstream ss(value);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) dirs.push_back(d);
    dirs.insert(dirs.end(), a.runtime.plugin_dirs.begin(), a.runtime.plugin_dirs.end());
    std::set<std::string> seen;
    a.runtime.plugin_dirs.clear();
    for (auto& d : dirs)
      if (seen.insert(d).second) a.runtime.plugin_dirs.push_back(std::move(d));
  };
  s.show = [](const TrainingArguments& a) {
    std::vector<std::string> q;
    for (const auto& d : a.runtime.plugin_dirs) q.push_back(quoted(d));
    return "[" + join(q) + "]";
  };
  return s;
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t);

// [plugin.<name>] tables, and KILN_PLUGIN_OPTIONS="<name>.<option>=<value>,..." over single options.
Setting plugin_options_setting() {
  Setting s{"plugin.<name>.<option>", "KILN_PLUGIN_OPTIONS"};
  s.from_toml = [](TrainingArguments& a, const toml::node& node, const std::string& source) {
    if (!node.is_table()) throw wrong_type(node, source, "plugin", "a table");
    for (const auto& [pk_, pv_] : in_file_order(*node.as_table())) {
      const toml::node& pv = *pv_;
      const std::string plugin(pk_->str());
      const std::string full = "plugin." + plugin;
      if (!pv.is_table()) throw wrong_type(pv, source, full, "a table");
      auto& opts = a.plugin_options[plugin];
      for (const auto& [ok_, ov_] : in_file_order(*pv.as_table())) {
        const toml::node& ov = *ov_;
        const std::string okey = full + "." + std::string(ok_->str());
        if (!(ov.is_string() || ov.is_integer() || ov.is_floating_point() || ov.is_boolean()))
          throw ConfigError(
              origin_of(ov, source), okey,
              "plugin option '" + okey + "' must be a string, integer, float or boolean, not " + a_type(ov));
        opts[std::string(ok_->str())] = scalar_to_string(ov);
        a.origins[okey] = origin_of(ov, source);
      }
    }
  };
  s.from_env = [](TrainingArguments& a, const std::string& value, const SettingOrigin& where) {
    std::stringstream ss(value);
    for (std::string entry; std::getline(ss, entry, ',');) {
      const size_t eq = entry.find('=');
      const size_t dot = entry.find('.');
      if (eq == std::string::npos || dot == 0 || dot == std::string::npos || dot + 1 >= eq)
        throw ConfigError(where, "plugin",
                          "entry '" + entry + "' must be <plugin>.<option>=<value>, as in " +
                              "'inductor.cxx=clang++'; entries are separated by ','");
      const std::string plugin = entry.substr(0, dot), option = entry.substr(dot + 1, eq - dot - 1);
      a.plugin_options[plugin][option] = entry.substr(eq + 1);
      a.origins["plugin." + plugin + "." + option] = where;
    }
  };
  s.show = [](const TrainingArguments&) { return std::string(); };
  return s;
}

const std::vector<Setting>& table() {
  static const std::vector<Setting> t = [] {
    std::vector<Setting> v;
    // Top level: the Hugging Face TrainingArguments names.
    v.push_back(flag(
        "torch_compile", "", [](auto& a) -> auto& { return a.torch_compile; }));
    v.push_back(turns_compile_on(text(
        "torch_compile_backend", "KILN_BACKEND", [](auto& a) -> auto& { return a.torch_compile_backend; },
        [](const std::string& s, const SettingOrigin& w, const std::string& k) {
          check_not_empty(s, w, k, "; use \"auto\"");
        })));
    v.push_back(turns_compile_on(text(
        "torch_compile_mode", "KILN_MODE", [](auto& a) -> auto& { return a.torch_compile_mode; }, check_mode)));
    v.push_back(max_grad_norm_setting());
    v.push_back(text(
        "log_level", "KILN_LOG_LEVEL", [](auto& a) -> auto& { return a.log_level; }, check_log_level));
    // Mixed precision and the optimizer a Trainer makes.
    v.push_back(flag(
        "bf16", "", [](auto& a) -> auto& { return a.bf16; }));
    v.push_back(flag(
        "fp16", "", [](auto& a) -> auto& { return a.fp16; }));
    v.push_back(flag(
        "tf32", "", [](auto& a) -> auto& { return a.tf32; }));
    v.push_back(text(
        "optim", "", [](auto& a) -> auto& { return a.optim; }, check_optim));
    v.push_back(real(
        "weight_decay", [](auto& a) -> auto& { return a.weight_decay; }, 0, 1e6, "a number from 0 to 1e6"));
    v.push_back(real(
        "adam_beta1", [](auto& a) -> auto& { return a.adam_beta1; }, 0, 0.999999999, "a number from 0 to below 1"));
    v.push_back(real(
        "adam_beta2", [](auto& a) -> auto& { return a.adam_beta2; }, 0, 0.999999999, "a number from 0 to below 1"));
    v.push_back(real(
        "adam_epsilon", [](auto& a) -> auto& { return a.adam_epsilon; }, 0, 1, "a number from 0 to 1"));
    // Trainer::train.
    v.push_back(text(
        "output_dir", "", [](auto& a) -> auto& { return a.output_dir; }));
    v.push_back(real(
        "num_train_epochs", [](auto& a) -> auto& { return a.num_train_epochs; }, 0, 1e9, "a number from 0 to 1e9"));
    v.push_back(integer(
        "max_steps", "", [](auto& a) -> auto& { return a.max_steps; }, -1, int64_t{1} << 40));
    v.push_back(integer(
        "per_device_train_batch_size", "", [](auto& a) -> auto& { return a.per_device_train_batch_size; }, 1,
        int64_t{1} << 30));
    v.push_back(integer(
        "gradient_accumulation_steps", "", [](auto& a) -> auto& { return a.gradient_accumulation_steps; }, 1,
        int64_t{1} << 20));
    v.push_back(flag(
        "group_by_length", "", [](auto& a) -> auto& { return a.group_by_length; }));
    v.push_back(integer(
        "pad_to_multiple_of", "", [](auto& a) -> auto& { return a.pad_to_multiple_of; }, 0, int64_t{1} << 20));
    v.push_back(learning_rate_setting());
    v.push_back(text(
        "lr_scheduler_type", "", [](auto& a) -> auto& { return a.lr_scheduler_type; }, check_lr_scheduler_type));
    v.push_back(integer(
        "warmup_steps", "", [](auto& a) -> auto& { return a.warmup_steps; }, 0, int64_t{1} << 40));
    v.push_back(real(
        "warmup_ratio", [](auto& a) -> auto& { return a.warmup_ratio; }, 0, 1, "a number from 0 to 1"));
    v.push_back(lr_scheduler_kwargs_setting());
    v.push_back(steps_setting(
        "logging_steps", [](auto& a) -> auto& { return a.logging_steps; }));
    v.push_back(flag(
        "logging_first_step", "", [](auto& a) -> auto& { return a.logging_first_step; }));
    v.push_back(integer(
        "seed", "", [](auto& a) -> auto& { return a.seed; }, 0, (int64_t{1} << 62)));
    v.push_back(data_seed_setting());
    v.push_back(text(
        "run_name", "", [](auto& a) -> auto& { return a.run_name; }));
    v.push_back(flag(
        "dataloader_drop_last", "", [](auto& a) -> auto& { return a.dataloader_drop_last; }));
    v.push_back(text(
        "save_strategy", "", [](auto& a) -> auto& { return a.save_strategy; },
        one_of({"no", "steps", "epoch"}, "save_strategy")));
    v.push_back(steps_setting(
        "save_steps", [](auto& a) -> auto& { return a.save_steps; }));
    v.push_back(integer(
        "save_total_limit", "", [](auto& a) -> auto& { return a.save_total_limit; }, 0, int64_t{1} << 30));
    v.push_back(resume_setting());
    v.push_back(flag(
        "overwrite_output_dir", "", [](auto& a) -> auto& { return a.overwrite_output_dir; }));
    v.push_back(flag(
        "load_best_model_at_end", "", [](auto& a) -> auto& { return a.load_best_model_at_end; }));
    v.push_back(text(
        "metric_for_best_model", "", [](auto& a) -> auto& { return a.metric_for_best_model; }));
    v.push_back(greater_is_better_setting());
    v.push_back(text(
        "eval_strategy", "", [](auto& a) -> auto& { return a.eval_strategy; },
        one_of({"no", "steps", "epoch"}, "eval_strategy")));
    v.push_back(steps_setting(
        "eval_steps", [](auto& a) -> auto& { return a.eval_steps; }, "is logging_steps"));
    v.push_back(integer(
        "per_device_eval_batch_size", "", [](auto& a) -> auto& { return a.per_device_eval_batch_size; }, 1,
        int64_t{1} << 30));
    v.push_back(report_to_setting());
    v.push_back(flag(
        "disable_tqdm", "", [](auto& a) -> auto& { return a.disable_tqdm; }));
    v.push_back(text(
        "ddp_backend", "", [](auto& a) -> auto& { return a.ddp_backend; },
        [](const std::string& s, const SettingOrigin& w, const std::string& k) {
          if (!s.empty()) one_of({"gloo", "nccl"}, "ddp_backend")(s, w, k);  // "": chosen by the model's device
        }));
    v.push_back(integer(
        "ddp_bucket_cap_mb", "", [](auto& a) -> auto& { return a.ddp_bucket_cap_mb; }, 1, int64_t{1} << 20));
    v.push_back(flag(
        "ddp_find_unused_parameters", "", [](auto& a) -> auto& { return a.ddp_find_unused_parameters; }));
    v.push_back(integer(
        "ddp_timeout", "", [](auto& a) -> auto& { return a.ddp_timeout; }, 1, int64_t{1} << 31));
    v.push_back(plugin_options_setting());
    // [runtime]
    v.push_back(plugin_dirs_setting());
    Setting cache = text(
        "runtime.cache_dir", "KILN_CACHE_DIR", [](auto& a) -> auto& { return a.runtime.cache_dir; },
        [](const std::string& s, const SettingOrigin& w, const std::string& k) { check_not_empty(s, w, k); });
    cache.default_doc = "$XDG_CACHE_HOME/kiln";
    v.push_back(std::move(cache));
    v.push_back(flag(
        "runtime.fullgraph", "", [](auto& a) -> auto& { return a.runtime.fullgraph; }));
    v.push_back(integer(
        "runtime.recompile_limit", "", [](auto& a) -> auto& { return a.runtime.recompile_limit; }, 0, 1000000));
    v.push_back(dynamic_setting());
    v.push_back(mark_dynamic_setting());
    v.push_back(integer(
        "runtime.dynamic_shape_cache", "", [](auto& a) -> auto& { return a.runtime.dynamic_shape_cache; }, 1, 1000000));
    v.push_back(flag(
        "runtime.cpu_block_cache", "KILN_CPU_CACHE", [](auto& a) -> auto& { return a.runtime.cpu_block_cache; }));
    v.push_back(integer(
        "runtime.cpu_block_cache_max_mb", "KILN_CPU_CACHE_MAX_MB",
        [](auto& a) -> auto& { return a.runtime.cpu_block_cache_max_mb; }, 0, int64_t{1} << 30));
    v.push_back(flag(
        "runtime.writeback_copy", "KILN_WRITEBACK_COPY", [](auto& a) -> auto& { return a.runtime.writeback_copy; }));
    v.push_back(flag(
        "runtime.graph_copies", "KILN_GRAPH_COPIES", [](auto& a) -> auto& { return a.runtime.graph_copies; }));
    v.push_back(text(
        "runtime.channels_last", "KILN_CHANNELS_LAST", [](auto& a) -> auto& { return a.runtime.channels_last; },
        one_of({"auto", "always", "never"}, "runtime.channels_last")));
    v.push_back(integer(
        "runtime.compile_threads", "KILN_COMPILE_THREADS", [](auto& a) -> auto& { return a.runtime.compile_threads; },
        0, 1024));
    Setting budget = real(
        "runtime.activation_memory_budget", [](auto& a) -> auto& { return a.runtime.activation_memory_budget; }, 0.0,
        1.0, "between 0 and 1");
    budget.env = "KILN_ACTIVATION_MEMORY_BUDGET";
    v.push_back(std::move(budget));
    // [debug]
    v.push_back(text(
        "debug.dump_dir", "KILN_DEBUG_DIR", [](auto& a) -> auto& { return a.debug.dump_dir; }));
    v.push_back(flag(
        "debug.check_meta", "KILN_CHECK_META", [](auto& a) -> auto& { return a.debug.check_meta; }));
    v.push_back(flag(
        "debug.verify_groups", "KILN_VERIFY_GROUPS", [](auto& a) -> auto& { return a.debug.verify_groups; }));
    v.push_back(flag(
        "debug.lift_runtime_scalars", "KILN_LIFT_RUNTIME_SCALARS",
        [](auto& a) -> auto& { return a.debug.lift_runtime_scalars; }));
    v.push_back(flag(
        "debug.no_comm_overlap", "KILN_NO_COMM_OVERLAP", [](auto& a) -> auto& { return a.debug.no_comm_overlap; }));
    // [experimental]
    v.push_back(flag(
        "experimental.batch_optimizer", "KILN_BATCH_OPTIMIZER",
        [](auto& a) -> auto& { return a.experimental.batch_optimizer; }));
    return v;
  }();
  return t;
}

const Setting* find_setting(const std::string& key) {
  for (const auto& s : table())
    if (s.key == key) return &s;
  return nullptr;
}

// The tables of kiln's own settings ([plugin.<name>] holds plugin options and is read apart).
const std::vector<std::string>& kiln_tables() {
  static const std::vector<std::string> t = {"runtime", "debug", "experimental"};
  return t;
}

bool is_kiln_table(const std::string& name) {
  const auto& t = kiln_tables();
  return std::find(t.begin(), t.end(), name) != t.end();
}

// The keys directly in `table` ("" is the top level), as written there; the top level lists the
// tables too.
std::vector<std::string> keys_in(const std::string& table_name) {
  std::vector<std::string> out;
  for (const auto& s : table()) {
    if (s.key.rfind("plugin.", 0) == 0) continue;
    const size_t dot = s.key.find('.');
    const std::string t = dot == std::string::npos ? "" : s.key.substr(0, dot);
    if (t == table_name) out.push_back(dot == std::string::npos ? s.key : s.key.substr(dot + 1));
  }
  if (table_name.empty()) {
    out.insert(out.end(), kiln_tables().begin(), kiln_tables().end());
    out.push_back("plugin");
  }
  return out;
}

// "did you mean": a near name in the same table first, else a near key of another table
// ('fullgraph' at the top level is 'runtime.fullgraph').
std::optional<std::string> suggest(const std::string& table_name, const std::string& name) {
  if (auto near = nearest_name(name, keys_in(table_name))) return table_name.empty() ? *near : table_name + "." + *near;
  std::vector<std::string> leaves, keys;
  for (const auto& s : table()) {
    if (s.key.rfind("plugin.", 0) == 0) continue;
    keys.push_back(s.key);
    leaves.push_back(s.key.substr(s.key.find('.') + 1));  // npos + 1 == 0: the whole key
  }
  if (auto near = nearest_name(name, leaves))
    return keys[std::find(leaves.begin(), leaves.end(), *near) - leaves.begin()];
  return std::nullopt;
}

// Hugging Face TrainingArguments keys kiln does not have, and what to do instead.
const std::map<std::string, std::string>& hugging_face_keys() {
  static const std::map<std::string, std::string> m = {
      {"evaluation_strategy", "Hugging Face renamed it 'eval_strategy', which kiln reads"},
      {"per_gpu_train_batch_size", "Hugging Face renamed it 'per_device_train_batch_size', which kiln reads"},
      {"per_gpu_eval_batch_size", "Hugging Face renamed it 'per_device_eval_batch_size', which kiln reads"},
      {"no_cuda", "kiln trains on the device your model's parameters are on: move the model with .to(torch::kCPU)"},
      {"use_cpu", "kiln trains on the device your model's parameters are on: move the model with .to(torch::kCPU)"},
      {"use_mps_device", "kiln trains on the device your model's parameters are on (CPU or CUDA)"},
      {"label_smoothing_factor",
       "kiln's Trainer calls the loss function you give it: use torch::nn::functional::cross_entropy with "
       "CrossEntropyFuncOptions().label_smoothing(x)"},
      {"gradient_checkpointing",
       "kiln does not rematerialise activations yet; leave it out (the step keeps what its backward reads)"},
      {"gradient_checkpointing_kwargs", "kiln does not rematerialise activations yet; leave it out"},
      {"dataloader_num_workers",
       "kiln's Trainer reads the dataset in the training thread; make Dataset::get cheap (tokenise ahead of time)"},
      {"dataloader_pin_memory", "kiln's Trainer moves each batch to the model's device itself; leave it out"},
      {"logging_strategy", "kiln logs every logging_steps optimizer steps ('steps'); set logging_steps"},
      {"logging_dir", "kiln writes its metrics to <output_dir>/metrics.jsonl (report_to)"},
      {"push_to_hub", "kiln does not upload; copy the checkpoint folders yourself"},
      {"hub_model_id", "kiln does not upload; copy the checkpoint folders yourself"},
      {"hub_token", "kiln does not upload; copy the checkpoint folders yourself"},
      {"deepspeed", "kiln has no DeepSpeed; data parallelism is torchrun with the Trainer (docs/distributed.md)"},
      {"fsdp", "kiln has no sharded data parallelism yet; data parallelism is torchrun with the Trainer"},
      {"local_rank", "kiln reads RANK, LOCAL_RANK and WORLD_SIZE from torchrun's environment"},
      {"fp16_opt_level", "Apex is not used; fp16 is not built yet, bf16 = true is"},
      {"half_precision_backend", "kiln's mixed precision is LibTorch's autocast (bf16 = true)"},
      {"bf16_full_eval",
       "not built yet: evaluation runs under bf16 autocast when bf16 = true, the model stays float32"},
      {"fp16_full_eval", "not built yet; bf16 = true runs evaluation under bf16 autocast"},
      {"eval_accumulation_steps", "kiln keeps every evaluation batch's outputs on their device until compute_metrics"},
      {"eval_delay", "not built yet: evaluation follows eval_strategy from the start"},
      {"save_safetensors", "kiln's checkpoints are LibTorch archives (model.pt, optimizer.pt)"},
      {"save_only_model", "not built yet: a checkpoint always holds the optimizer and the schedule too"},
      {"save_on_each_node", "rank 0 alone writes checkpoints"},
      {"remove_unused_columns", "kiln's datasets hand the Trainer tensors, not columns; leave it out"},
      {"label_names", "the target is the last tensor of each example (Dataset::get)"},
      {"optim_args", "make the optimizer yourself and hand it to the Trainer"},
      {"auto_find_batch_size", "not built yet: set per_device_train_batch_size"},
      {"full_determinism", "kiln's compiled step computes what eager computes; seed your program (seed)"},
      {"torchdynamo", "use torch_compile_backend"},
      {"use_ipex", "use torch_compile_backend = \"ipex\""},
      {"jit_mode_eval", "evaluation runs the model eagerly"},
      {"prediction_loss_only", "evaluation computes eval_loss, and the metrics only when compute_metrics is given"},
      {"ignore_data_skip", "a resumed run always continues the data where the checkpoint stopped"},
      {"include_inputs_for_metrics", "not built yet: compute_metrics gets predictions and labels"},
      {"neftune_noise_alpha", "not built yet"},
      {"skip_memory_metrics", "kiln does not log memory metrics"},
      {"log_on_each_node", "rank 0 alone logs metrics"},
      {"logging_nan_inf_filter", "kiln logs the loss as it is"},
      {"ddp_broadcast_buffers", "the Trainer broadcasts rank 0's parameters and buffers once, when it joins the world"},
      {"do_train", "call Trainer::train from your program"},
      {"do_eval", "call Trainer::evaluate, or set eval_strategy"},
      {"do_predict", "call Trainer::predict"},
      {"torch_empty_cache_steps", "LibTorch's caching allocator keeps its blocks; kiln does not empty it"},
      {"log_level_replica", "ranks other than 0 log at the level of the environment's KILN_LOG_LEVEL"},
      {"tpu_num_cores", "kiln has no TPU backend"},
      {"debug", "use the [debug] table (dump_dir, check_meta, verify_groups)"},
      {"fsdp_config", "kiln has no sharded data parallelism yet"},
      {"accelerator_config", "kiln does not use Accelerate"},
      {"length_column_name", "group_by_length reads each example's length from Dataset::length"},
      {"dataloader_persistent_workers", "kiln's Trainer reads the dataset in the training thread"},
      {"dataloader_prefetch_factor", "kiln's Trainer reads the dataset in the training thread"},
      {"past_index", "kiln's Trainer keeps no past state between steps"},
      {"adafactor", "LibTorch has no Adafactor; use optim, or make your own optimizer"},
      {"hub_strategy", "kiln does not upload; copy the checkpoint folders yourself"},
      {"hub_private_repo", "kiln does not upload; copy the checkpoint folders yourself"},
      {"hub_always_push", "kiln does not upload; copy the checkpoint folders yourself"},
      {"restore_callback_states_from_checkpoint",
       "not built yet: a resumed run starts its callbacks afresh (the best metric and checkpoint are kept)"},
      {"eval_do_concat_batches", "evaluation concatenates the batches' outputs along dim 0 (padded with -100)"},
      {"ray_scope", "kiln has no hyper-parameter search"},
      {"include_tokens_per_second", "not built yet: kiln bench reports tokens per second"},
      {"include_num_input_tokens_seen", "not built yet"},
      {"optim_target_modules", "make your own optimizer with the parameter groups you want"},
      {"batch_eval_metrics", "compute_metrics runs once, over every batch's outputs"},
      {"eval_on_start", "call Trainer::evaluate before Trainer::train"},
      {"use_liger_kernel", "kiln's backends generate their own fused kernels (torch_compile)"},
      {"eval_use_gather_object", "evaluation runs on each rank's data; rank 0 logs"},
      {"average_tokens_across_devices", "the Trainer averages each rank's loss"},
  };
  return m;
}

ConfigError unknown_key(const std::string& table_name, const std::string& name, const SettingOrigin& where) {
  const std::string full = table_name.empty() ? name : table_name + "." + name;
  if (table_name.empty())
    if (auto it = hugging_face_keys().find(name); it != hugging_face_keys().end())
      return ConfigError(where, full, "key '" + full + "' is Hugging Face's, and kiln does not have it: " + it->second);
  std::string msg = "unknown key '" + full + "'";
  if (auto near = suggest(table_name, name)) msg += "; did you mean '" + *near + "'?";
  else msg += "; known keys here: " + join(keys_in(table_name));
  return ConfigError(where, full, msg);
}

// The layout before [runtime]: [compile], [training] and [logging]. Files written for it get an
// error that says where each key went.
const std::map<std::string, std::string>& moved_keys() {
  static const std::map<std::string, std::string> m = {
      {"compile.torch_compile", "torch_compile"},
      {"compile.torch_compile_backend", "torch_compile_backend"},
      {"compile.torch_compile_mode", "torch_compile_mode"},
      {"compile.fullgraph", "runtime.fullgraph"},
      {"compile.recompile_limit", "runtime.recompile_limit"},
      {"compile.plugin_dirs", "runtime.plugin_dirs"},
      {"compile.cache_dir", "runtime.cache_dir"},
      {"training.max_grad_norm", "max_grad_norm"},
      {"logging.level", "log_level"},
  };
  return m;
}

const std::map<std::string, std::string>& moved_tables() {
  static const std::map<std::string, std::string> m = {
      {"compile", "the top level (torch_compile, torch_compile_backend, torch_compile_mode) and [runtime]"},
      {"training", "the top level (max_grad_norm)"},
      {"logging", "the top level (log_level)"},
  };
  return m;
}

// A table's entries in the order the file wrote them (toml++ keeps them sorted by name), so the
// first error reported is the first in the file and later keys override earlier ones as written.
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> out;
  for (const auto& [k, v] : t) out.emplace_back(&k, &v);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto& x = a.first->source().begin;
    const auto& y = b.first->source().begin;
    return std::tie(x.line, x.column) < std::tie(y.line, y.column);
  });
  return out;
}

void moved_table_error(const std::string& old_table, const toml::key& key, const toml::node& node,
                       const std::string& source) {
  const auto& tables = moved_tables();
  const std::string& where_now = tables.at(old_table);
  if (!node.is_table())
    throw ConfigError(at(key.source(), source), old_table,
                      "table '" + old_table + "' is gone: its keys moved to " + where_now);
  for (const auto& [k, v] : in_file_order(*node.as_table())) {
    const std::string full = old_table + "." + std::string(k->str());
    auto it = moved_keys().find(full);
    if (it != moved_keys().end())
      throw ConfigError(at(k->source(), source), full, "key '" + full + "' moved to '" + it->second + "'");
    std::string msg = "unknown key '" + full + "'; table '" + old_table + "' is gone: its keys moved to " + where_now;
    std::vector<std::string> old_names, new_keys;
    for (const auto& [o, n] : moved_keys())
      if (o.rfind(old_table + ".", 0) == 0) old_names.push_back(o.substr(old_table.size() + 1)), new_keys.push_back(n);
    if (auto near = nearest_name(std::string(k->str()), old_names))
      msg += "; did you mean '" + new_keys[std::find(old_names.begin(), old_names.end(), *near) - old_names.begin()] +
             "'?";
    throw ConfigError(at(k->source(), source), full, msg);
  }
  throw ConfigError(at(key.source(), source), old_table,
                    "table '" + old_table + "' is gone: its keys moved to " + where_now);
}

SettingOrigin origin_or_code(const TrainingArguments& a, const std::string& key) {
  auto it = a.origins.find(key);
  return it == a.origins.end() ? SettingOrigin{"code", 0, 0} : it->second;
}

}  // namespace

const std::vector<std::string>& valid_modes() {
  static const std::vector<std::string> m = {"default", "reduce-overhead", "max-autotune",
                                             "max-autotune-no-cudagraphs"};
  return m;
}

const std::vector<std::string>& builtin_backends() {
  static const std::vector<std::string> b = {"auto", "inductor", "cudagraphs", "ipex", "hpu_backend", "neuron"};
  return b;
}

std::string SettingOrigin::describe() const {
  if (line > 0) return source + ":" + std::to_string(line) + ":" + std::to_string(column);
  return source.empty() ? std::string("code") : source;
}

ConfigError::ConfigError(SettingOrigin where, std::string key, std::string what)
    : std::runtime_error(where.describe() + ": " + what), where_(std::move(where)), key_(std::move(key)) {}

std::optional<std::string> nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::optional<std::string> best;
  size_t best_d = 0;
  for (const auto& c : candidates) {
    size_t d = distance(name, c);
    if (!best || d < best_d) best = c, best_d = d;
  }
  // Close enough to be a typo: at most a third of the longer name, and at least one edit allowed.
  if (best && best_d <= std::max<size_t>(2, std::max(name.size(), best->size()) / 3)) return best;
  return std::nullopt;
}

std::string default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln";
  return "/tmp/kiln-cache";
}

std::vector<SettingInfo> settings() {
  const TrainingArguments defaults;
  std::vector<SettingInfo> out;
  for (const auto& s : table()) out.push_back({s.key, s.env, s.default_doc.empty() ? s.show(defaults) : s.default_doc});
  return out;
}

std::string initial_log_level() {
  const char* v = std::getenv(find_setting("log_level")->env.c_str());
  if (!v || !*v) return "info";
  const auto& levels = log_levels();
  return std::find(levels.begin(), levels.end(), v) != levels.end() ? v : "info";
}

bool TrainingArguments::compile_enabled() const {
  return torch_compile || torch_compile_backend != "auto" || torch_compile_mode != "default";
}

TrainingArguments TrainingArguments::from_toml(const std::string& path) {
  TrainingArguments args;
  args.apply_toml(path);
  args.apply_env();
  return args;
}

TrainingArguments TrainingArguments::from_toml_string(const std::string& text, const std::string& source_name) {
  TrainingArguments args;
  args.apply_toml_string(text, source_name);
  args.apply_env();
  return args;
}

void TrainingArguments::apply_toml(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError({path, 0, 0}, "", "cannot open the configuration file");
  std::stringstream ss;
  ss << in.rdbuf();
  apply_toml_string(ss.str(), path);
}

void TrainingArguments::apply_toml_string(const std::string& text, const std::string& source) {
  const std::string guarded = guard_toml_text(text, source);
  toml::table root;
  try {
    root = toml::parse(guarded, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(at(e.source(), source), "", "TOML syntax error: " + std::string(e.description()));
  }

  auto apply = [&](const Setting& s, const toml::node& v) {
    const SettingOrigin where = origin_of(v, source);
    s.from_toml(*this, v, source);
    if (s.check) s.check(*this, where);
    origins[s.key] = where;
  };

  for (const auto& [k, node] : in_file_order(root)) {
    const std::string name(k->str());
    if (is_kiln_table(name)) {
      if (!node->is_table()) throw wrong_type(*node, source, name, "a table");
      for (const auto& [tk, v] : in_file_order(*node->as_table())) {
        const Setting* s = find_setting(name + "." + std::string(tk->str()));
        if (!s) throw unknown_key(name, std::string(tk->str()), at(tk->source(), source));
        apply(*s, *v);
      }
    } else if (name == "plugin") {
      find_setting("plugin.<name>.<option>")->from_toml(*this, *node, source);
    } else if (moved_tables().count(name)) {
      moved_table_error(name, *k, *node, source);
    } else if (const Setting* s = find_setting(name)) {
      apply(*s, *node);
    } else {
      throw unknown_key("", name, at(k->source(), source));
    }
  }
}

void TrainingArguments::apply_env() {
  for (const auto& s : table()) {
    if (s.env.empty()) continue;
    const char* v = std::getenv(s.env.c_str());
    if (!v || !*v) continue;  // set but empty is unset, as in `KILN_BACKEND= ./train`
    const SettingOrigin where = env_origin(s.env);
    s.from_env(*this, v, where);
    if (s.check) s.check(*this, where);
    if (s.key.rfind("plugin.", 0) != 0) origins[s.key] = where;  // plugin options record each option
  }
}

void TrainingArguments::validate() const {
  for (const auto& s : table())
    if (s.check) s.check(*this, origin_or_code(*this, s.key));
}

void TrainingArguments::validate_backend(const std::vector<std::string>& available,
                                         const std::map<std::string, std::string>& refused) const {
  if (torch_compile_backend == "auto") return;
  // "a+b" composes backends: b takes what a leaves. Each part is a backend's name ("auto" and
  // "eager" are not: what a composition leaves runs eagerly anyway).
  const std::vector<std::string> parts = split_backends(torch_compile_backend);
  for (const auto& part : parts) {
    const bool composed = parts.size() > 1;
    if (composed && (part == "auto" || part == "eager" || part.empty()))
      throw ConfigError(origin_or_code(*this, "torch_compile_backend"), "torch_compile_backend",
                        "'" + torch_compile_backend + "': a composition of backends (\"a+b\": b takes the nodes a " +
                            "leaves) names backends, not '" + part + "'");
    if (std::find(available.begin(), available.end(), part) != available.end()) continue;
    if (auto bad = refused.find(part); bad != refused.end())
      throw ConfigError(origin_or_code(*this, "torch_compile_backend"), "torch_compile_backend",
                        "backend '" + part + "' was found, but kiln refused its plugin file " + bad->second);
    std::string msg = "unknown backend '" + part + "'" + (composed ? " in '" + torch_compile_backend + "'" : "");
    if (auto near = nearest_name(part, available)) msg += "; did you mean '" + *near + "'?";
    msg += " Backends found: " + (available.empty() ? std::string("(none)") : join(available));
    throw ConfigError(origin_or_code(*this, "torch_compile_backend"), "torch_compile_backend", msg);
  }
}

}  // namespace kiln
