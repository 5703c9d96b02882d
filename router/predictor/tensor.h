#pragma once
// The evaluator's tensor: a shape and row-major values. Length predictors only need floats, plus
// int64 for shapes (Reshape) and Cast results; both are held as double-free float/int64 vectors.
#include <cstdint>
#include <string>
#include <vector>

namespace tailserve {

struct Tensor {
  enum class Type { kFloat, kInt64 };
  Type type = Type::kFloat;
  std::vector<int64_t> dims;
  std::vector<float> f;    // kFloat
  std::vector<int64_t> i;  // kInt64

  static Tensor Float(std::vector<int64_t> dims, std::vector<float> values) {
    Tensor t;
    t.dims = std::move(dims);
    t.f = std::move(values);
    return t;
  }
  static Tensor Int64(std::vector<int64_t> dims, std::vector<int64_t> values) {
    Tensor t;
    t.type = Type::kInt64;
    t.dims = std::move(dims);
    t.i = std::move(values);
    return t;
  }
  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  std::string ShapeString() const;
};

}  // namespace tailserve
