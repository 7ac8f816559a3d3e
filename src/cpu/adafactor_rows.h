// Adafactor's arithmetic on a range of rows, shared by the CPU backend's adafactor_step (all rows) and the
// ZeRO step over row shards (optim/adafactor_shards.cpp), so that both give the same bits.
//
// A parameter is rows x cols: a matrix [..., m, n] is batch * m rows of n (its factored statistics are per
// batch), a vector or scalar is numel rows of 1. Every sum over rows is the fixed tree of cpu/row_tree.h;
// every sum along a row runs left to right in double.
#pragma once

#include <cstdint>
#include <functional>

namespace memtrain::cpu::adafactor {

// R[i] := beta2t R[i] + (1 - beta2t) mean_j (g[i, j]^2 + eps1), for the `rows` rows at g and R.
void update_row_stats(const float* g, float* R, std::int64_t rows, std::int64_t cols, double beta2t, double eps1);
// Row i's columns [c0, c1) as floats: a pointer to column c0 (into the gradient, or into `scratch`, which holds
// c1 - c0 floats, after converting them there).
using RowReader = std::function<const float*(std::int64_t i, std::int64_t c0, std::int64_t c1, float* scratch)>;
// out[j] := the tree over `rows` rows of (g[i, j]^2 + eps1), for every column, the rows read through `row`.
void column_sums_of_rows(std::int64_t rows, std::int64_t cols, double eps1, const RowReader& row, double* out);
// The same over `rows` rows at g, `cols` wide.
void column_sums(const float* g, std::int64_t rows, std::int64_t cols, double eps1, double* out);
// C[j] := beta2t C[j] + (1 - beta2t) col_sum[j] / rows_of_batch.
void update_col_stats(const double* col_sum, float* C, std::int64_t cols, std::int64_t rows_of_batch, double beta2t);
// sum_i R[i] over one batch's rows, left to right in double.
double row_stats_total(const float* R, std::int64_t rows_of_batch);
// u[i, j] := g[i, j] / sqrt(R[i] C[j] / r_mean), for `rows` rows (R at their first row).
void factored_update(const float* g, const float* R, const float* C, double r_mean, float* u, std::int64_t rows,
                     std::int64_t cols);
// The same for columns [j0, j1) of one row with statistic R_i: u[j - j0] := g[j - j0] / sqrt(R_i C[j] / r_mean).
void factored_update_columns(const float* g, float R_i, const float* C, double r_mean, std::int64_t j0,
                             std::int64_t j1, float* u);
// V[i] := beta2t V[i] + (1 - beta2t) (g[i]^2 + eps1).
void update_vector_stats(const float* g, float* V, std::int64_t n, double beta2t, double eps1);
// u[i] := g[i] / sqrt(V[i]).
void vector_update(const float* g, const float* V, float* u, std::int64_t n);
// out[i] := sum_j u[i, j]^2 in double, left to right, for `rows` rows: the leaves of the update's RMS.
void row_squares(const float* u, std::int64_t rows, std::int64_t cols, double* out);
// The clip scale lr / max(1, rms / clip) from the update's total sum of squares over `numel` elements.
float clipped_scale(double sum_sq, std::int64_t numel, double lr, double clip_threshold);
// p := p (1 - wd lr) - u scale, through the first moment M when M is not null (M := b1 M + (1 - b1) u scale).
void apply(float* p, const float* u, float* M, std::int64_t n, float scale, double lr, double weight_decay,
           double beta1);

}  // namespace memtrain::cpu::adafactor
