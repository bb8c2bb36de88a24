#include "kiln/internal/ir_text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

namespace kiln::ir {
namespace {

constexpr int64_t kMaxValueId = (int64_t{1} << 20) - 1;

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};

const DtypeName kDtypes[] = {
    {c10::ScalarType::Float, "f32"},
    {c10::ScalarType::Double, "f64"},
    {c10::ScalarType::Half, "f16"},
    {c10::ScalarType::BFloat16, "bf16"},
    {c10::ScalarType::Long, "i64"},
    {c10::ScalarType::Int, "i32"},
    {c10::ScalarType::Short, "i16"},
    {c10::ScalarType::Char, "i8"},
    {c10::ScalarType::Byte, "u8"},
    {c10::ScalarType::Bool, "bool"},
    {c10::ScalarType::ComplexFloat, "c64"},
    {c10::ScalarType::ComplexDouble, "c128"},
    {c10::ScalarType::Float8_e4m3fn, "f8e4m3fn"},
    {c10::ScalarType::Float8_e5m2, "f8e5m2"},
};

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string print_real(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  std::string s = buf;
  // Shortest form that reads back exactly.
  for (int p = 1; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) {
      s = buf;
      break;
    }
  }
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

template <class T, class F>
std::string join_list(const std::vector<T>& v, F f) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + f(v[i]);
  return out;
}

std::string val(ValueId v) { return v == kNoValue ? std::string("None") : "%" + std::to_string(v); }

}  // namespace

const char* dtype_short_name(c10::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return c10::toString(t);
}

std::string print_type(const TensorMeta& m) {
  std::string s = dtype_short_name(m.dtype);
  auto dims = [](const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out;
  };
  s += "[" + dims(m.shape) + "]{" + dims(m.strides) + "}";
  if (m.storage_offset != 0) s += "+" + std::to_string(m.storage_offset);
  if (m.device.type() != c10::kCPU || m.device.has_index()) s += " on " + m.device.str();
  return s;
}

static std::string print_arg_value(const Arg& a);

std::string print_arg(const Arg& a) {
  if (a.scalar_input >= 0) return "$" + std::to_string(a.scalar_input) + ":" + print_arg_value(a);
  return print_arg_value(a);
}

static std::string print_arg_value(const Arg& a) {
  using K = Arg::Kind;
  auto scalar = [&](const std::string& inner) { return a.is_scalar ? "scalar(" + inner + ")" : inner; };
  switch (a.kind) {
    case K::None: return "None";
    case K::Tensor: return val(a.value);
    case K::TensorList: return "t[" + join_list(a.values, val) + "]";
    case K::Bool: return scalar(a.i ? "true" : "false");
    case K::Int: return scalar(std::to_string(a.i));
    case K::Double: return scalar(print_real(a.d));
    case K::IntList: return "i[" + join_list(a.ints, [](int64_t x) { return std::to_string(x); }) + "]";
    case K::DoubleList: return "f[" + join_list(a.doubles, print_real) + "]";
    case K::BoolList:
      return "b[" + join_list(a.ints, [](int64_t x) { return std::string(x ? "true" : "false"); }) + "]";
    case K::String: return quote(a.s);
    case K::ScalarType: return std::string("dtype(") + dtype_short_name(static_cast<c10::ScalarType>(a.i)) + ")";
    case K::Device: return "device(" + quote(a.s) + ")";
    case K::Layout: return "layout(" + std::to_string(a.i) + ")";
    case K::MemoryFormat: return "memory_format(" + std::to_string(a.i) + ")";
  }
  return "?";
}

std::string print(const Graph& g) {
  std::ostringstream os;
  os << "graph {\n";
  for (size_t i = 0; i < g.scalar_inputs.size(); ++i) {
    const auto& si = g.scalar_inputs[i];
    os << "  scalar $" << i << " "
       << (si.kind == Arg::Kind::Int    ? "int"
           : si.kind == Arg::Kind::Bool ? "bool"
                                        : "float")
       << " " << quote(si.name) << "\n";
  }
  for (const auto& in : g.inputs)
    os << "  input " << val(in.value) << " : " << print_type(g.value(in.value).meta)
       << (g.value(in.value).storage >= 0 ? " &" + std::to_string(g.value(in.value).storage) : std::string()) << " "
       << to_string(in.role) << " " << quote(in.name) << "\n";
  for (const auto& n : g.nodes) {
    os << "  ";
    if (n.outputs.empty()) os << "()";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      os << (k ? ", " : "");
      if (n.outputs[k] == kNoValue) {
        os << "_";
        continue;
      }
      const Value& v = g.value(n.outputs[k]);
      os << val(n.outputs[k]) << " : " << print_type(v.meta);
      if (v.storage >= 0) os << " &" << v.storage;
    }
    os << " = " << n.op << "(" << join_list(n.args, print_arg) << ")";
    if (n.returns_list) os << " list";
    if (n.phase != Phase::Unknown) os << " " << to_string(n.phase);
    os << "\n";
  }
  for (const auto& out : g.outputs) {
    os << "  output " << val(out.value) << " " << to_string(out.role);
    if (out.role != OutputRole::Result || out.target >= 0) os << " " << out.target;
    os << " " << quote(out.name) << "\n";
  }
  os << "}\n";
  return os.str();
}

ParseError::ParseError(int line, int column, const std::string& message)
    : std::runtime_error(std::to_string(line) + ":" + std::to_string(column) + ": " + message),
      line_(line),
      column_(column) {}

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(text) {}

  Graph parse() {
    skip_ws();
    expect_word("graph");
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      if (at_end()) fail("unexpected end of text; expected '}'");
      parse_line();
    }
    skip_ws();
    if (!at_end()) fail("unexpected text after the closing '}'");
    // Ids need not be dense (a pass may have removed values); holes stay unused values.
    for (size_t i = 0; i < g_.values.size(); ++i) g_.values[i].id = static_cast<ValueId>(i);
    g_.reindex();
    try {
      g_.verify();
    } catch (const std::logic_error& e) {
      fail(e.what());
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    throw ParseError(line, col, msg);
  }
  bool at_end() const { return pos_ >= t_.size(); }
  char peek() const { return at_end() ? '\0' : t_[pos_]; }
  void skip_ws() {
    while (!at_end()) {
      if (std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      else if (t_[pos_] == '#')
        while (!at_end() && t_[pos_] != '\n') ++pos_;
      else break;
    }
  }
  // Skips spaces and tabs only: line structure matters for the optional trailing words.
  void skip_blank() {
    while (!at_end() && (t_[pos_] == ' ' || t_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_blank();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool accept(char c) {
    skip_blank();
    if (peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string word() {
    skip_blank();
    size_t start = pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_' || peek() == ':' ||
                         peek() == '.' || peek() == '-'))
      ++pos_;
    return t_.substr(start, pos_ - start);
  }
  void expect_word(const std::string& w) {
    size_t save = pos_;
    if (word() != w) {
      pos_ = save;
      fail("expected '" + w + "'");
    }
  }
  int64_t integer() {
    skip_blank();
    size_t start = pos_;
    if (peek() == '-' || peek() == '+') ++pos_;
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected an integer");
    while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    return std::stoll(t_.substr(start, pos_ - start));
  }
  std::string quoted() {
    skip_blank();
    if (peek() != '"') fail("expected a quoted string");
    ++pos_;
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      char c = t_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      char e = t_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'x':
          out += static_cast<char>(std::stoi(t_.substr(pos_, 2), nullptr, 16));
          pos_ += 2;
          break;
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
    return out;
  }
  ValueId value_ref() {
    skip_blank();
    if (peek() != '%') fail("expected a value such as %3");
    ++pos_;
    int64_t id = integer();
    // Values are stored by id, so an id is memory: at most kMaxValueId (a million values, about
    // 100 MB), far beyond any step's graph. A larger one is an error, not gigabytes allocated.
    if (id < 0 || id > kMaxValueId) fail("value id out of range (0 to " + std::to_string(kMaxValueId) + ")");
    return static_cast<ValueId>(id);
  }
  c10::ScalarType dtype() {
    skip_blank();
    const size_t start = pos_;
    std::string w = word();
    for (const auto& d : kDtypes)
      if (w == d.name) return d.type;
    for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
      auto t = static_cast<c10::ScalarType>(i);
      if (w == c10::toString(t)) return t;
    }
    pos_ = start;
    fail("unknown dtype '" + w + "'");
  }
  std::vector<int64_t> int_list(char open, char close) {
    expect(open);
    std::vector<int64_t> v;
    if (accept(close)) return v;
    do v.push_back(integer());
    while (accept(','));
    expect(close);
    return v;
  }
  TensorMeta type() {
    TensorMeta m;
    m.dtype = dtype();
    m.shape = int_list('[', ']');
    m.strides = int_list('{', '}');
    if (m.strides.size() != m.shape.size()) fail("strides and shape have different ranks");
    if (accept('+')) m.storage_offset = integer();
    size_t save = pos_;
    if (word() == "on") {
      std::string dev = word();
      // c10 keeps a device index in 8 bits: "cuda:198" would become cuda:-58, which prints as text
      // that no longer parses. Only a device that prints as written is taken.
      bool ok = false;
      try {
        m.device = c10::Device(dev);
        ok = m.device.str() == dev;
      } catch (const std::exception&) {
      }
      if (!ok) fail("bad device '" + dev + "'");
    } else {
      pos_ = save;
    }
    return m;
  }
  double real() {
    skip_blank();
    size_t start = pos_;
    while (!at_end() &&
           (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '.' || peek() == '-' || peek() == '+'))
      ++pos_;
    std::string s = t_.substr(start, pos_ - start);
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (s.empty() || *end) fail("bad number '" + s + "'");
    return d;
  }
  // A bare number: an integer unless it has '.', 'e', inf or nan.
  Arg number() {
    skip_blank();
    size_t start = pos_;
    if (peek() == '-' || peek() == '+') ++pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '.' ||
                         ((peek() == '-' || peek() == '+') && (t_[pos_ - 1] == 'e' || t_[pos_ - 1] == 'E'))))
      ++pos_;
    std::string s = t_.substr(start, pos_ - start);
    pos_ = start;
    if (s.find_first_of(".eEn") != std::string::npos || s == "inf" || s == "-inf") return Arg::real(real());
    return Arg::integer(integer());
  }
  Arg arg() {
    skip_blank();
    if (peek() == '$') {
      ++pos_;
      const int64_t index = integer();
      expect(':');
      Arg a = arg();
      if (a.kind != Arg::Kind::Int && a.kind != Arg::Kind::Double && a.kind != Arg::Kind::Bool)
        fail("a run-time scalar ($N:) holds a number or a boolean");
      if (index < 0 || static_cast<size_t>(index) >= g_.scalar_inputs.size())
        fail("run-time scalar $" + std::to_string(index) + " is not declared");
      a.scalar_input = static_cast<int32_t>(index);
      return a;
    }
    char c = peek();
    if (c == '%') return Arg::tensor(value_ref());
    if (c == '"') {
      Arg a;
      a.kind = Arg::Kind::String;
      a.s = quoted();
      return a;
    }
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c))) return number();
    size_t save = pos_;
    std::string w = word();
    if (w == "None") return Arg::none();
    if (w == "true" || w == "false") return Arg::boolean(w == "true");
    if (w == "inf" || w == "nan") return Arg::real(w == "inf" ? INFINITY : std::nan(""));
    if (w == "scalar") {
      expect('(');
      Arg a = arg();
      if (a.kind != Arg::Kind::Int && a.kind != Arg::Kind::Double && a.kind != Arg::Kind::Bool)
        fail("scalar(...) holds a number or a boolean");
      a.is_scalar = true;
      expect(')');
      return a;
    }
    if (w == "dtype") {
      expect('(');
      Arg a = Arg::scalar_type(dtype());
      expect(')');
      return a;
    }
    if (w == "device") {
      expect('(');
      Arg a;
      a.kind = Arg::Kind::Device;
      a.s = quoted();
      expect(')');
      return a;
    }
    if (w == "layout" || w == "memory_format") {
      expect('(');
      Arg a;
      a.kind = w == "layout" ? Arg::Kind::Layout : Arg::Kind::MemoryFormat;
      a.i = integer();
      expect(')');
      return a;
    }
    if (w == "i" || w == "f" || w == "b" || w == "t") {
      expect('[');
      Arg a;
      a.kind = w == "i"   ? Arg::Kind::IntList
               : w == "f" ? Arg::Kind::DoubleList
               : w == "b" ? Arg::Kind::BoolList
                          : Arg::Kind::TensorList;
      if (!accept(']')) {
        do {
          if (w == "i") a.ints.push_back(integer());
          else if (w == "f") a.doubles.push_back(real());
          else if (w == "b") {
            std::string bw = word();
            if (bw != "true" && bw != "false") fail("expected true or false");
            a.ints.push_back(bw == "true");
          } else {
            skip_blank();
            if (peek() == '%') a.values.push_back(value_ref());
            else {
              expect_word("None");
              a.values.push_back(kNoValue);
            }
          }
        } while (accept(','));
        expect(']');
      }
      return a;
    }
    pos_ = save;
    fail("expected an argument");
  }
  int32_t storage_suffix() {
    if (!accept('&')) return -1;
    return static_cast<int32_t>(integer());
  }
  void define(ValueId id, const TensorMeta& m, size_t at) {
    if (static_cast<size_t>(id) >= g_.values.size()) {
      g_.values.resize(id + 1);
      defined_.resize(id + 1, 0);
    }
    if (defined_[id]) {
      pos_ = at;
      fail("value %" + std::to_string(id) + " is defined twice");
    }
    defined_[id] = 1;
    g_.values[id].id = id;
    g_.values[id].meta = m;
  }
  void parse_line() {
    size_t save = pos_;
    std::string w = word();
    if (w == "input") {
      skip_blank();
      const size_t at = pos_;
      ValueId id = value_ref();
      expect(':');
      TensorMeta m = type();
      const int32_t storage = storage_suffix();
      skip_blank();
      const size_t role_at = pos_;
      std::string role = word();
      InputRole r;
      if (role == "input") r = InputRole::UserInput;
      else if (role == "param") r = InputRole::Parameter;
      else if (role == "buffer") r = InputRole::Buffer;
      else if (role == "grad") r = InputRole::Gradient;
      else if (role == "state") r = InputRole::OptimizerState;
      else if (role == "const") r = InputRole::Constant;
      else if (role == "scalar") r = InputRole::Scalar;
      else {
        pos_ = role_at;
        fail("unknown input role '" + role + "'");
      }
      define(id, m, at);
      g_.values[id].storage = storage;
      g_.inputs.push_back({id, r, quoted()});
      return;
    }
    if (w == "scalar") {
      skip_blank();
      if (peek() != '$') fail("expected $N");
      ++pos_;
      const int64_t index = integer();
      if (index != static_cast<int64_t>(g_.scalar_inputs.size())) fail("run-time scalars must be declared in order");
      ScalarInput si;
      const std::string kind = word();
      if (kind == "int") si.kind = Arg::Kind::Int;
      else if (kind == "float") si.kind = Arg::Kind::Double;
      else if (kind == "bool") si.kind = Arg::Kind::Bool;
      else fail("unknown scalar kind '" + kind + "'; use int, float or bool");
      si.name = quoted();
      g_.scalar_inputs.push_back(std::move(si));
      return;
    }
    if (w == "output") {
      Output o;
      o.value = value_ref();
      std::string role = word();
      if (role == "result") {
        o.role = OutputRole::Result;
        skip_blank();
        if (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) o.target = static_cast<int32_t>(integer());
      } else if (role == "writeback" || role == "grad") {
        o.role = role == "grad" ? OutputRole::Gradient : OutputRole::WriteBack;
        o.target = static_cast<int32_t>(integer());
      } else {
        fail("unknown output role '" + role + "'; use result, writeback or grad");
      }
      o.name = quoted();
      g_.outputs.push_back(std::move(o));
      return;
    }
    pos_ = save;
    Node n;
    if (accept('(')) {
      expect(')');
    } else {
      do {
        skip_blank();
        if (peek() == '_') {
          ++pos_;
          n.outputs.push_back(kNoValue);
          continue;
        }
        const size_t at = pos_;
        ValueId id = value_ref();
        expect(':');
        define(id, type(), at);
        g_.values[id].storage = storage_suffix();
        n.outputs.push_back(id);
      } while (accept(','));
    }
    expect('=');
    skip_blank();
    const size_t op_at = pos_;
    n.op = word();
    if (n.op.find("::") == std::string::npos) pos_ = op_at, fail("expected an operator name such as aten::add.Tensor");
    expect('(');
    if (!accept(')')) {
      do n.args.push_back(arg());
      while (accept(','));
      expect(')');
    }
    while (true) {
      skip_blank();
      if (at_end() || peek() == '\n' || peek() == '#') break;
      std::string extra = word();
      if (extra == "list") n.returns_list = true;
      else if (extra == "forward") n.phase = Phase::Forward;
      else if (extra == "backward") n.phase = Phase::Backward;
      else if (extra == "optimizer") n.phase = Phase::Optimizer;
      else if (extra == "recompute") n.phase = Phase::Recompute;
      else fail("unexpected '" + extra + "' after a node");
    }
    g_.nodes.push_back(std::move(n));
  }

  const std::string& t_;
  size_t pos_ = 0;
  Graph g_;
  std::vector<char> defined_;
};

}  // namespace

Graph parse(const std::string& text) { return Parser(text).parse(); }

}  // namespace kiln::ir
