// The lm_head the MTP draft steps multiply by. A draft step runs one MTP layer and the whole [V, H] lm_head;
// on a checkpoint whose lm_head is bf16 (as published: HY V4's and Qwen4-Exp's are) the head is most of a
// draft step's bytes. An FP8 e4m3 copy with 128 x 128 block scales reads half of them. The output stays the
// target's exactly: a draft only proposes (the target verifies every token, and sampling accepts against the
// probabilities the draft was actually drawn from), so a coarser head can change only how many drafts are
// accepted (docs/performance.md measures it on the bundled models). A head small enough to stay in cache
// gains nothing from fewer bytes and loses to FP8's decode work (a 64 x 4096 matrix in L2: ~15% slower than
// bf16 on AVX-512 and AVX2), so by default (kAuto) only a head of kAutoMinBytes or more gets the copy.
// `nextn logits --draft` keeps the target's head: it reports the checkpoint's MTP layer as transformers
// computes it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "ops/ops.h"

namespace nextn {

class ThreadPool;

enum class DraftHeadKind {
  kAuto,    // kFp8 for a head of DraftHead::kAutoMinBytes or more, else kTarget
  kTarget,  // the target's lm_head itself
  kFp8,     // an FP8 block-quantized copy (the target's head when that already is FP8)
};
// "auto" / "target" / "fp8" (throws nextn::Error naming `what` for anything else).
DraftHeadKind parse_draft_head(const std::string& s, const std::string& what);
const char* draft_head_name(DraftHeadKind k);

// The head the draft steps use: the target's, or an owned FP8 copy of it.
class DraftHead {
 public:
  static constexpr int64_t kBlock = 128;  // scale blocks of the copy: [kBlock rows, kBlock columns]
  static constexpr int64_t kAutoMinBytes = int64_t(8) << 20;  // (a bundled model's head: 1 MiB)

  // Makes `kind`'s head of `target` (a copy only for kFp8, or kAuto at auto_min_bytes or more, of a head that
  // is not FP8 already; its rows quantized on `pool`'s threads).
  void build(const Linear& target, DraftHeadKind kind, ThreadPool* pool, int64_t auto_min_bytes = kAutoMinBytes);
  // The head of the draft steps: the copy, or `target` itself when there is none.
  const Linear& for_drafts(const Linear& target) const { return is_copy() ? own_ : target; }
  bool is_copy() const { return own_.data != nullptr; }
  // Gives a device backend's blocks the copy to upload (its `hold`), when there is one: after every change of
  // blocks (use_device, a rank's GPU) and of the head (use_draft_head).
  template <class Blocks>
  void hold_in(Blocks& blocks) const {
    if (is_copy()) blocks.hold(own_);
  }
  int64_t copy_bytes() const { return int64_t(bytes_.size() + scales_.size() * sizeof(float)); }
  // One line: "lm_head (BF16) for the target and the drafts" / "..., an FP8 copy (12 MiB) for the drafts".
  std::string describe(const Linear& target) const;

 private:
  Linear own_;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> bytes_;  // [V, H] e4m3 codes
  std::vector<float> scales_;                               // [ceil(V / kBlock), ceil(H / kBlock)]
};

// The e4m3 copy of w (any dtype ops::dequant_row reads): per [block, block] tile, scale = max |w| / 448 (1 for
// a tile of zeros) and each code the nearest to w / scale, for the block rows [block_row0, block_row1) (each
// independent of the others). bytes [out · in], scales [ceil(out / block) · ceil(in / block)], fp32.
void quantize_fp8_block_rows(const Linear& w, int64_t block, int64_t block_row0, int64_t block_row1, uint8_t* bytes,
                             float* scales);

}  // namespace nextn
