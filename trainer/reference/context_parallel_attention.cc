#include "trainer/reference/context_parallel_attention.h"

#include <utility>

namespace leantron::trainer::reference {
namespace {

constexpr uint32_t kForwardTag = 0;
constexpr uint32_t kBackwardTag = 1;

// Shapes every mode shares: B samples of Tl local tokens (T in all), this rank's H heads and G
// query groups of D (Rw = the qkv row, Ow = the output row), and K/V blocks of B·Tl·2GD.
struct Dims {
  int64_t b, tl, t, h, g, d;
  int cp, rank;
  int64_t qkv_row() const { return (h + 2 * g) * d; }
  int64_t out_row() const { return h * d; }
  int64_t kv_block() const { return b * tl * g * 2 * d; }
};

class ContextParallelAttention final : public CoreAttention {
 public:
  ContextParallelAttention(const Context& ctx, Workspace& ws, const LayerShard& shard,
                           CpCommType type)
      : ctx_(ctx), ws_(ws), shard_(shard), type_(type) {}

  size_t saved_elements() const override {
    const Dims m = dims();
    if (type_ != CpCommType::kAllToAll) return m.b * m.h * m.tl;  // log-sum-exp
    // The exchanged qkv [B, T, row/CP], the head-split output [B, T, H·D/CP], its log-sum-exp.
    return m.b * m.tl * m.qkv_row() + m.b * m.tl * m.out_row() + m.b * m.h * m.tl;
  }
  size_t scratch_elements() const override {
    const Dims m = dims();
    switch (type_) {
      case CpCommType::kP2P:  // two travelling [kv | dkv] buffers
        return 4 * m.kv_block();
      case CpCommType::kAllGather:  // local kv, every rank's kv and dkv, the local dkv
        return (2 + 2 * static_cast<size_t>(m.cp)) * m.kv_block();
      case CpCommType::kAllToAll:  // send and receive, kv and dkv, dout and dqkv head-split
        return 3 * m.b * m.tl * m.qkv_row() + 2 * m.kv_block() + m.b * m.tl * m.out_row();
    }
    return 0;
  }

  void Forward(float* out, float* saved, const float* qkv, const AttentionInputs& in) override {
    switch (type_) {
      case CpCommType::kP2P:
        return RingForward(out, saved, qkv, in);
      case CpCommType::kAllGather:
        return GatherForward(out, saved, qkv, in);
      case CpCommType::kAllToAll:
        return UlyssesForward(out, saved, qkv, in);
    }
  }
  void Backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* saved, const AttentionInputs& in) override {
    switch (type_) {
      case CpCommType::kP2P:
        return RingBackward(dqkv, dout, qkv, out, saved, in);
      case CpCommType::kAllGather:
        return GatherBackward(dqkv, dout, qkv, out, saved, in);
      case CpCommType::kAllToAll:
        return UlyssesBackward(dqkv, dout, saved, in);
    }
  }

 private:
  Dims dims() const {
    return Dims{ctx_.micro_batch, ctx_.seq_length, ctx_.chunks.seq_length, shard_.heads,
                shard_.groups,    shard_.head_dim, ctx_.chunks.size,       ctx_.chunks.rank};
  }
  Ops& ops() const { return *ctx_.ops; }
  Communicator& cp() const { return *ctx_.cp; }
  // This rank's queries against CP rank `src`'s keys.
  BlockAttentionArgs Block(int src, const AttentionInputs& in) const {
    const Dims m = dims();
    return BlockAttentionArgs{m.b,
                              m.tl,
                              m.tl,
                              m.h,
                              m.g,
                              m.d,
                              m.t,
                              ctx_.positions_of(m.rank),
                              ctx_.positions_of(src),
                              in.documents};
  }
  // The ring order every mode computes blocks in: own block first, then rank−1, rank−2, …
  int Source(int step) const {
    const Dims m = dims();
    return (m.rank - step + m.cp) % m.cp;
  }
  void SplitKv(float* kv, const float* qkv) const {
    const Dims m = dims();
    SplitKeysValues(ops(), kv, qkv, m.b * m.tl, m.h, m.g, m.d);
  }
  void MergeKvGrad(float* dqkv, const float* dkv) const {
    const Dims m = dims();
    MergeKeyValueGrad(ops(), dqkv, dkv, m.b * m.tl, m.h, m.g, m.d);
  }

  // ---- p2p: ring attention
  void RingForward(float* out, float* lse, const float* qkv, const AttentionInputs& in) {
    const Dims m = dims();
    const int next = (m.rank + 1) % m.cp, prev = (m.rank + m.cp - 1) % m.cp;
    float* hand = ws_.attention;
    float* arriving = ws_.attention + m.kv_block();
    SplitKv(hand, qkv);
    for (int step = 0; step < m.cp; ++step) {
      const bool more = step + 1 < m.cp;
      if (more) cp().SendAsync(hand, m.kv_block(), next, kForwardTag);
      ops().BlockAttentionForward(out, lse, qkv, hand, Block(Source(step), in), in.dropout,
                                  step > 0);
      if (more) {
        cp().Recv(arriving, m.kv_block(), prev, kForwardTag);
        std::swap(hand, arriving);
      }
    }
    cp().WaitSends();
  }

  void RingBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                    const float* lse, const AttentionInputs& in) {
    const Dims m = dims();
    const int next = (m.rank + 1) % m.cp, prev = (m.rank + m.cp - 1) % m.cp;
    const size_t kv = m.kv_block();
    // A travelling block is [kv | dkv]; its dkv gathers every rank's share on the way round.
    float* hand = ws_.attention;
    float* arriving = ws_.attention + 2 * kv;
    SplitKv(hand, qkv);
    ops().Zero(hand + kv, kv);
    ops().Zero(dqkv, m.b * m.tl * m.qkv_row());
    for (int step = 0; step < m.cp; ++step) {
      ops().BlockAttentionBackward(dqkv, hand + kv, dout, out, lse, qkv, hand,
                                   Block(Source(step), in), in.dropout);
      if (step + 1 < m.cp) {
        cp().SendAsync(hand, 2 * kv, next, kBackwardTag);
        cp().Recv(arriving, 2 * kv, prev, kBackwardTag);
      } else {
        // The block in hand is rank+1's, complete: home it goes; ours arrives from rank−1.
        cp().SendAsync(hand + kv, kv, next, kBackwardTag);
        cp().Recv(arriving + kv, kv, prev, kBackwardTag);
      }
      std::swap(hand, arriving);
    }
    cp().WaitSends();
    MergeKvGrad(dqkv, hand + kv);
  }

  // ---- all_gather
  void GatherForward(float* out, float* lse, const float* qkv, const AttentionInputs& in) {
    const Dims m = dims();
    float* local = ws_.attention;
    float* all = local + m.kv_block();
    SplitKv(local, qkv);
    cp().AllGather(local, all, m.kv_block());
    for (int step = 0; step < m.cp; ++step) {
      const int src = Source(step);
      ops().BlockAttentionForward(out, lse, qkv, all + src * m.kv_block(), Block(src, in),
                                  in.dropout, step > 0);
    }
  }

  void GatherBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                      const float* lse, const AttentionInputs& in) {
    const Dims m = dims();
    const size_t kv = m.kv_block();
    float* local = ws_.attention;
    float* all = local + kv;
    float* dall = all + m.cp * kv;
    float* dlocal = dall + m.cp * kv;
    SplitKv(local, qkv);
    cp().AllGather(local, all, kv);
    ops().Zero(dall, m.cp * kv);
    ops().Zero(dqkv, m.b * m.tl * m.qkv_row());
    for (int step = 0; step < m.cp; ++step) {
      const int src = Source(step);
      ops().BlockAttentionBackward(dqkv, dall + src * kv, dout, out, lse, qkv, all + src * kv,
                                   Block(src, in), in.dropout);
    }
    cp().ReduceScatter(dall, dlocal, kv);
    MergeKvGrad(dqkv, dlocal);
  }

  // ---- a2a: heads split over CP (query group by query group, so each part is itself a
  // grouped-layout qkv row: G/CP groups and their H/CP heads).
  struct Ulysses {
    int64_t row, out_row, groups, heads;  // the head-split widths and counts
    // Where `saved` keeps the exchanged qkv [B, T, row] (at 0), the head-split output
    // [B, T, out_row] and its log-sum-exp [B, heads, T].
    int64_t out_at, lse_at;
  };
  Ulysses Split() const {
    const Dims m = dims();
    Ulysses u;
    u.row = m.qkv_row() / m.cp;
    u.out_row = m.out_row() / m.cp;
    u.groups = m.g / m.cp;
    u.heads = m.h / m.cp;
    u.out_at = m.b * m.t * u.row;
    u.lse_at = u.out_at + m.b * m.t * u.out_row;
    return u;
  }
  // [B, Tl, cp·width] (my tokens, every part) → [B, T, width] (every rank's tokens, my part).
  void ToHeads(float* heads_split, const float* local, int64_t width) {
    const Dims m = dims();
    float* send = ws_.attention;
    float* recv = send + m.b * m.tl * m.qkv_row();
    const int64_t block = m.b * m.tl * width;
    for (int p = 0; p < m.cp; ++p)
      ops().Copy2D(send + p * block, width, local + p * width, m.cp * width, m.b * m.tl, width);
    cp().AllToAll(send, recv, block);
    for (int p = 0; p < m.cp; ++p)
      ops().Copy2D(heads_split + p * m.tl * width, m.t * width, recv + p * block, m.tl * width, m.b,
                   m.tl * width);
  }
  // The inverse: [B, T, width] → [B, Tl, cp·width].
  void ToTokens(float* local, const float* heads_split, int64_t width) {
    const Dims m = dims();
    float* send = ws_.attention;
    float* recv = send + m.b * m.tl * m.qkv_row();
    const int64_t block = m.b * m.tl * width;
    for (int p = 0; p < m.cp; ++p)
      ops().Copy2D(send + p * block, m.tl * width, heads_split + p * m.tl * width, m.t * width, m.b,
                   m.tl * width);
    cp().AllToAll(send, recv, block);
    for (int p = 0; p < m.cp; ++p)
      ops().Copy2D(local + p * width, m.cp * width, recv + p * block, width, m.b * m.tl, width);
  }
  BlockAttentionArgs WholeSamples(const Ulysses& u, const AttentionInputs& in) const {
    const Dims m = dims();
    const int32_t* all = ctx_.positions_of(0);  // every rank's tokens, rank by rank
    return BlockAttentionArgs{m.b, m.t, m.t, u.heads, u.groups, m.d, m.t, all, all, in.documents};
  }
  AttentionDropout HeadDropout(const Ulysses& u, const AttentionInputs& in) const {
    AttentionDropout d = in.dropout;
    d.head_offset += dims().rank * u.heads;
    return d;
  }

  void UlyssesForward(float* out, float* saved, const float* qkv, const AttentionInputs& in) {
    const Dims m = dims();
    const Ulysses u = Split();
    float *qkv_h = saved, *out_h = saved + u.out_at, *lse_h = saved + u.lse_at;
    float* kv = ws_.attention + 2 * m.b * m.tl * m.qkv_row();
    ToHeads(qkv_h, qkv, u.row);
    SplitKeysValues(ops(), kv, qkv_h, m.b * m.t, u.heads, u.groups, m.d);
    ops().BlockAttentionForward(out_h, lse_h, qkv_h, kv, WholeSamples(u, in), HeadDropout(u, in),
                                false);
    ToTokens(out, out_h, u.out_row);
  }

  void UlyssesBackward(float* dqkv, const float* dout, const float* saved,
                       const AttentionInputs& in) {
    const Dims m = dims();
    const Ulysses u = Split();
    const float *qkv_h = saved, *out_h = saved + u.out_at, *lse_h = saved + u.lse_at;
    float* kv = ws_.attention + 2 * m.b * m.tl * m.qkv_row();
    float* dkv = kv + m.kv_block();
    float* dout_h = dkv + m.kv_block();
    float* dqkv_h = dout_h + m.b * m.tl * m.out_row();
    ToHeads(dout_h, dout, u.out_row);
    SplitKeysValues(ops(), kv, qkv_h, m.b * m.t, u.heads, u.groups, m.d);
    ops().Zero(dkv, m.kv_block());
    ops().Zero(dqkv_h, m.b * m.t * u.row);
    ops().BlockAttentionBackward(dqkv_h, dkv, dout_h, out_h, lse_h, qkv_h, kv, WholeSamples(u, in),
                                 HeadDropout(u, in));
    MergeKeyValueGrad(ops(), dqkv_h, dkv, m.b * m.t, u.heads, u.groups, m.d);
    ToTokens(dqkv, dqkv_h, u.row);
  }

  const Context& ctx_;
  Workspace& ws_;
  LayerShard shard_;
  CpCommType type_;
};

}  // namespace

std::unique_ptr<CoreAttention> MakeContextParallelAttention(const Context& ctx, Workspace& ws,
                                                            const LayerShard& shard,
                                                            CpCommType type) {
  return std::make_unique<ContextParallelAttention>(ctx, ws, shard, type);
}

}  // namespace leantron::trainer::reference
