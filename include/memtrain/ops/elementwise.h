// Elementwise ops. Binary ops broadcast (numpy rules) and need equal dtypes. f32 and f64 are computed
// natively; f16, bf16 and fp8 inputs are computed in f32 and rounded back to their dtype. All are
// differentiable unless noted.
#pragma once

#include "memtrain/core/tensor.h"

namespace memtrain::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);  // a - s
Tensor rsub(double s, const Tensor& a); // s - a
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);  // a / s
Tensor rdiv(double s, const Tensor& a); // s / a

Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
enum class GeluApproximation { none, tanh };  // none: x * Phi(x) with erf; tanh: GPT-2's approximation
Tensor gelu(const Tensor& a, GeluApproximation approximation = GeluApproximation::tanh);
Tensor silu(const Tensor& a);
Tensor clamp(const Tensor& a, double lo, double hi);  // gradient passes where lo <= a <= hi

// cond: boolean tensor, broadcast against a and b. Gradient flows to a where cond, to b elsewhere.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Elements where mask (boolean, broadcast to a's shape) is true become value; their gradient is zero.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// Comparisons give boolean tensors (not differentiable).
Tensor gt(const Tensor& a, double s);
Tensor lt(const Tensor& a, double s);
Tensor eq(const Tensor& a, const Tensor& b);

// In place, not recorded by autograd: self += other (other broadcast to self's shape), self *= s.
Tensor& add_(Tensor& self, const Tensor& other);
Tensor& mul_(Tensor& self, double s);

Tensor zeros_like(const Tensor& a);
Tensor ones_like(const Tensor& a);

}  // namespace memtrain::ops

namespace memtrain {
inline Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return ops::add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return ops::sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return ops::mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return ops::div(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return ops::add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return ops::rsub(s, a); }
inline Tensor operator*(double s, const Tensor& a) { return ops::mul(a, s); }
inline Tensor operator/(double s, const Tensor& a) { return ops::rdiv(s, a); }
inline Tensor operator-(const Tensor& a) { return ops::neg(a); }
}  // namespace memtrain
