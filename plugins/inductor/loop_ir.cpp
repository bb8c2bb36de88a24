#include "loop_ir.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace kiln::inductor {

const char* c_type(Ty t) {
  switch (t) {
    case Ty::f32: return "float";
    case Ty::f64: return "double";
    case Ty::i64: return "int64_t";
    case Ty::i32: return "int32_t";
    case Ty::b8: return "bool";
    case Ty::bf16: return "uint16_t";  // storage only: the C++ emitter computes it in float
  }
  return "?";
}

size_t ty_size(Ty t) {
  switch (t) {
    case Ty::f32:
    case Ty::i32: return 4;
    case Ty::f64:
    case Ty::i64: return 8;
    case Ty::b8: return 1;
    case Ty::bf16: return 2;
  }
  return 0;
}

bool is_float(Ty t) { return t == Ty::f32 || t == Ty::f64 || t == Ty::bf16; }

std::optional<Ty> ty_of(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return Ty::f32;
  if (t.code == kDLFloat && t.bits == 64) return Ty::f64;
  if (t.code == kDLBfloat && t.bits == 16) return Ty::bf16;
  if (t.code == kDLInt && t.bits == 64) return Ty::i64;
  if (t.code == kDLInt && t.bits == 32) return Ty::i32;
  if (t.code == KILN_DL_BOOL && t.bits == 8) return Ty::b8;
  return std::nullopt;
}

// ---- Index ----

namespace {
void add_terms(std::vector<std::pair<int, int64_t>>& into, const std::vector<std::pair<int, int64_t>>& from,
               int64_t k) {
  for (const auto& [id, c] : from) {
    auto it = std::lower_bound(into.begin(), into.end(), std::make_pair(id, INT64_MIN));
    if (it != into.end() && it->first == id) {
      it->second += c * k;
      if (it->second == 0) into.erase(it);
    } else if (c * k != 0) {
      into.insert(it, {id, c * k});
    }
  }
}
}  // namespace

Index Index::constant(int64_t c) {
  Index i;
  i.c = c;
  return i;
}
Index Index::var(int v) {
  Index i;
  i.vars.push_back({v, 1});
  return i;
}
Index Index::expr(int e) {
  Index i;
  i.exprs.push_back({e, 1});
  return i;
}
Index Index::operator+(const Index& o) const {
  Index r = *this;
  r.c += o.c;
  add_terms(r.vars, o.vars, 1);
  add_terms(r.exprs, o.exprs, 1);
  return r;
}
Index Index::scaled(int64_t k) const {
  Index r;
  if (k == 0) return r;
  r.c = c * k;
  add_terms(r.vars, vars, k);
  add_terms(r.exprs, exprs, k);
  return r;
}
int64_t Index::coef(int v) const {
  for (const auto& [id, c] : vars)
    if (id == v) return c;
  return 0;
}
std::string Index::key() const {
  std::string s = std::to_string(c);
  for (const auto& [v, k] : vars) s += "+" + std::to_string(k) + "*v" + std::to_string(v);
  for (const auto& [e, k] : exprs) s += "+" + std::to_string(k) + "*t" + std::to_string(e);
  return s;
}

// ---- ExprPool ----

int ExprPool::add(Expr e) {
  char cbuf[64];
  std::snprintf(cbuf, sizeof cbuf, "%a", e.c);
  std::string key = std::to_string(static_cast<int>(e.k)) + "|" + std::to_string(static_cast<int>(e.ty)) + "|" + e.op +
                    "|" + cbuf + "|" + std::to_string(e.param) + "|" + std::to_string(e.buf) + "|" + e.idx.key() + "|";
  for (int a : e.args) key += std::to_string(a) + ",";
  // A load's logical index does not change what it reads; keep the first one recorded.
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  exprs_.push_back(std::move(e));
  const int id = static_cast<int>(exprs_.size() - 1);
  memo_.emplace(std::move(key), id);
  return id;
}

int ExprPool::constant(double c, Ty ty) {
  Expr e;
  e.k = Expr::K::Const;
  e.ty = ty;
  e.c = c;
  return add(std::move(e));
}

int ExprPool::param(int k, Ty ty) {
  Expr e;
  e.k = Expr::K::Param;
  e.ty = ty;
  e.param = k;
  return add(std::move(e));
}

int ExprPool::op(const std::string& name, Ty ty, std::vector<int> args) {
  Expr e;
  e.k = Expr::K::Op;
  e.ty = ty;
  e.op = name;
  e.args = std::move(args);
  return add(std::move(e));
}

int ExprPool::cast(int a, Ty ty) {
  if (at(a).ty == ty) return a;
  if (at(a).k == Expr::K::Const) return constant(at(a).c, ty);
  return op("cast", ty, {a});
}

// ---- ValueInfo / LoweredGraph ----

int64_t ValueInfo::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

int64_t ValueInfo::extent() const {
  int64_t e = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    e += (shape[d] - 1) * std::max<int64_t>(strides[d], 0);
  }
  return e;
}

Index LoweredGraph::offset(const ValueInfo& v, const Idx& idx) {
  Index off;
  for (size_t d = 0; d < v.shape.size(); ++d)
    if (v.shape[d] != 1) off = off + idx[d].scaled(v.strides[d]);
  return off;
}

int LoweredGraph::load(ExprPool& pool, int v, const Idx& idx) const {
  const ValueInfo& info = values[static_cast<size_t>(v)];
  if (!info.materialized) return compute(pool, v, idx);
  // An output that a computed value is written straight into (materialize.cpp) is read as that
  // value through the view: the same address, but the load names the value really stored and its
  // own index, so a kernel that computes the value is not also handed a read of an element another
  // thread stores (a transpose of it).
  if (info.alias_of >= 0 && values[static_cast<size_t>(info.alias_of)].kind != ValueInfo::Kind::Extern)
    return compute(pool, v, idx);
  Expr e;
  e.k = Expr::K::Load;
  e.ty = info.ty;
  e.buf = info.buffer;
  e.idx = offset(info, idx);
  e.value = v;
  e.logical = idx;
  e.logical_known = true;
  return pool.add(std::move(e));
}

int LoweredGraph::compute(ExprPool& pool, int v, const Idx& idx) const {
  const ValueInfo& info = values[static_cast<size_t>(v)];
  switch (info.kind) {
    case ValueInfo::Kind::Pointwise:
    case ValueInfo::Kind::View: return info.body(pool, idx);
    case ValueInfo::Kind::Reshape: {
      // The source is materialized (lowering makes sure): address its buffer with this value's
      // own strides, which describe the same storage.
      const ValueInfo& src = values[static_cast<size_t>(info.src)];
      if (!src.materialized) throw std::logic_error("reshape of a value without a buffer");
      Index off = Index::constant(info.storage_offset - src.storage_offset) + offset(info, idx);
      Expr e;
      e.k = Expr::K::Load;
      e.ty = info.ty;
      e.buf = src.buffer;
      e.idx = off;
      e.value = info.src;
      e.logical_known = false;
      return pool.add(std::move(e));
    }
    default: throw std::logic_error("value " + std::to_string(v) + " has no pointwise definition");
  }
}

}  // namespace kiln::inductor
