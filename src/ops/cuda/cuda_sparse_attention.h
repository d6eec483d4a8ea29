// CUDA kernels of QSA, Qwen4-Exp's sparse attention (models/qwen4_exp/cpu_blocks.cpp, qsa, says what each step
// is): block-pooled indexer keys, block scores, the selection of slots they give, and grouped-query attention
// over the selected slots with the output gate. Device pointers; queued on the calling thread's default stream.
// Rows, slots and pages are described by cuda::RowCaches (cuda_nn.h). Every (row, head) is computed by one
// block in a fixed order: a row's values do not depend on the other rows of the forward.
#pragma once
#include <cstdint>

#include "ops/cuda/cuda_nn.h"

namespace nextn::cuda {

// For each row r whose slot s completes a block of `ratio` slots ((s + 1) % ratio == 0): the mean of the raw
// index keys (plane `plane`, columns [0, dim)) of slots s + 1 - ratio .. s, RMS-normalized with `norm`, rotated
// ("rotate half", the first rope_dim elements) at the block's first position block_position[r], written to
// columns [dim, 2·dim) of the block's first slot.
void pool_block_keys(const RowCaches& rc, int plane, int64_t rows, int64_t dim, int64_t ratio, const float* norm,
                     float eps, int64_t rope_dim, const float* inv_freq, float attention_factor,
                     const int32_t* block_position);

// out[r, b] = scale · Σ_h relu(q[r, h] · pooled_b) for the blocks b < (slot[r] + 1) / ratio, pooled keys in
// columns [dim, 2·dim) of plane `plane` at slot b · ratio; q [rows, q_stride] with `heads` heads of dim.
// max_blocks bounds every row's block count (out rows out_stride apart).
void block_scores(const float* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t dim, const RowCaches& rc,
                  int plane, int64_t ratio, int64_t max_blocks, float scale, float* out, int64_t out_stride);

// Each row's slots, ascending, into sel[r, 0..count[r]) (rows sel_stride apart, at most sel_stride of them):
// with forced_count[r] >= 0, the forced slots forced[r, ..] that are <= slot[r] and < forced_from[r], then every
// slot from forced_from[r] to slot[r]; else the ratio slots of each kept block blocks[r, 0..block_count[r])
// (blocks_stride apart), then the slots after the last complete block. (forced may be null: no row is forced.)
void expand_selection(const RowCaches& rc, int64_t rows, int64_t ratio, const int32_t* blocks,
                      const int32_t* block_count, int64_t blocks_stride, const int32_t* forced,
                      const int32_t* forced_count, const int32_t* forced_from, int64_t forced_stride, int32_t* sel,
                      int32_t* count, int64_t sel_stride);

// Attention of each row's heads over its selected slots: q [rows, heads, 2·hd] (each head's query, then its
// output gate); the cache plane `plane` holds [k | v] of kv_heads heads of hd per slot; head h reads kv head
// h / (heads / kv_heads). p = softmax(scale · q·k) over the slots in sel order, o = Σ p·v, out[r, h] = o ·
// sigmoid(gate) ([rows, heads, hd]).
void sparse_gqa_attention(const float* q, int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd,
                          const RowCaches& rc, int plane, const int32_t* sel, const int32_t* count,
                          int64_t sel_stride, float scale, float* out);

}  // namespace nextn::cuda
