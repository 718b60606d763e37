// One flat fp32 buffer for the parameters of this rank's (tp, pp) shard, one for their gradients,
// and named views into both with Megatron-Core names, so the optimizer steps one buffer, data
// parallelism reduces it in buckets and checkpoints name its pieces. Which tensors and which shard
// shapes come from libckpt's layout; nothing here derives a split rule.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class GradBuffers;    // grad_buffers.h
class WeightBuffers;  // weight_buffers.h
struct DpBucket;

struct ParamView {
  std::string name;  // Megatron-Core name, global layer index
  const ckpt::ParamSpec* spec = nullptr;
  std::vector<int64_t> shard_shape;
  size_t offset = 0;  // into the flat buffers
  size_t numel = 0;
  bool decay = true;  // no weight decay on biases and 1-D (norm) parameters
  // Counted in the global gradient norm by this rank: replicated tensors only on TP rank 0, and
  // the tied output copy never (its gradient equals the embedding's).
  bool count_in_norm = true;
  // Replicated across TP ranks but computed from this rank's sequence shard (sequence
  // parallelism): its gradient is all-reduced over TP.
  bool tp_partial_grad = false;
  // With the master weights on the host or sharded: where its backend fp32 copy starts in the
  // mirror, or kNoMirror (the model computes with its bf16 copy only).
  static constexpr size_t kNoMirror = ~size_t{0};
  size_t mirror = kNoMirror;
};

// The tensors the bf16 model computes with in fp32 (the norms and the embeddings; every other
// tensor it reads from its bf16 copy).
bool Bf16ModelReadsFp32(const std::string& name);

// Where the fp32 main weights live.
//   kWhole: all of them in backend memory.
//   kHost (--optimizer-cpu-offload): all of them, or with --optimizer-offload-fraction below 1
//     the tensors from host_begin() on (the last ones of the flat order, the fraction of the
//     elements rounded up to whole tensors), in pinned host memory, where the optimizer steps
//     them; the backend keeps the others and an fp32 mirror of only the host's tensors the bf16
//     model reads in fp32 (Bf16ModelReadsFp32), besides the bf16 copy and the fp32 gradients.
//   kSharded (the distributed optimizer of the bf16 model, as Megatron's): only the flat ranges
//     this rank steps (SetShard), in backend memory, but for the same mirror, whole (the norms
//     and embeddings this rank steps are stepped there, where the model reads them); and the
//     bf16 copy, which this store then allocates and writes on every rewrite. The other ranks'
//     parts of the bf16 copy and the mirror arrive after each step (the gradient reducer, or
//     Optimizer).
//   kHostSharded (--optimizer-cpu-offload with the distributed optimizer over DP x CP > 1): as
//     kSharded, but this rank's ranges, all of them, in pinned host memory, packed in flat order
//     (the order of the optimizer's moments), where the host steps them; the mirror and the bf16
//     copy on the backend as with kSharded, the host step writing this rank's parts of both.
//   kShardedCompute (the float32 model with --data-parallel-sharding-strategy
//     optim_grads_params): the fp32 weights are also what the model computes with, kept as
//     WeightBuffers (ShardWeights, before SetShard): this rank's ranges in their parts' storage
//     or in place in the whole buffers of the embeddings and head, the layers read from slots
//     that a listener gathers before use. No mirror, no bf16 copy.
// With kSharded, ShardWeights (optim_grads_params) keeps the bf16 copy as WeightBuffers too.
enum class MasterWeights { kWhole, kHost, kSharded, kHostSharded, kShardedCompute };

class ParamStore {
 public:
  // `host_fraction` (kHost): the share of the elements whose fp32 weights live on the host.
  ParamStore(Ops* ops, const ckpt::ModelLayout& layout, int tp_rank, int pp_rank,
             bool sequence_parallel, MasterWeights master = MasterWeights::kWhole,
             double host_fraction = 1.0);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // --data-parallel-sharding-strategy optim_grads_params: the weights the model computes with
  // (the bf16 copy with kSharded, the fp32 weights with kShardedCompute) kept as WeightBuffers
  // over `chunks`' buckets, this rank's part of each; once, before SetShard and before a model
  // binds them.
  void ShardWeights(const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks);
  // Those buffers, or null.
  const WeightBuffers* weights() const { return weights_.get(); }

  // kSharded, kHostSharded, kShardedCompute: the sorted, disjoint flat ranges of the fp32 weights
  // this rank keeps and steps (its parts of the data-parallel buckets); once, before Initialize or
  // any SetFromHost.
  void SetShard(std::vector<std::pair<size_t, size_t>> ranges);

  // Megatron's initialisation, computed on the full tensor and then sharded, so that every layout
  // starts from the same weights: normal(0, std) for weights and embeddings, std/sqrt(2L) for the
  // output-side linears, ones/zeros for norms, zeros for biases.
  void Initialize(uint64_t seed, double init_std);

  // The fp32 weights in the flat order: backend memory, or pinned host memory with kHost (all of
  // them there); null when they are in two places (kHost with a part on the backend) or with
  // kSharded and kHostSharded (no rank holds them whole: Master, Optimizer::GatherMaster).
  float* data() { return sharded() || host_begin_ > 0 ? nullptr : master_; }
  // The fp32 weight at flat index `flat` and those after it up to MasterRunEnd(flat) (every
  // index with kWhole and kHost; with kSharded and kHostSharded only those in the shard, else
  // it aborts).
  float* Master(size_t flat);
  // Where the run of fp32 weights contiguous in memory from `flat` on ends: size(), but with
  // kHost at host_begin(), with kSharded at the edges of the shard's ranges and of the mirrored
  // tensors in them, with kHostSharded at the edges of the shard's ranges.
  size_t MasterRunEnd(size_t flat) const;
  // The fp32 gradients in the flat order, or null when they are sharded (grads()).
  float* grad();
  // Where the gradients live: whole, or sharded (ShardGrads).
  GradBuffers& grads() const { return *grads_; }
  // --data-parallel-sharding-strategy optim_grads: the gradients kept as GradBuffers' sharded
  // ones, over `chunks`' buckets, this rank's part of each; once, before a model binds them.
  void ShardGrads(const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks);
  size_t size() const { return size_; }
  MasterWeights master() const { return master_place_; }
  // kHost: the optimizer steps [host_begin(), size()) on the host, the rest on the backend;
  // kHostSharded: this rank's shard on the host.
  bool offloaded() const {
    return master_place_ == MasterWeights::kHost || master_place_ == MasterWeights::kHostSharded;
  }
  size_t host_begin() const { return offloaded() ? host_begin_ : size_; }
  // Every fp32 weight in pinned host memory, data() in the flat order.
  bool host_master() const { return master_place_ == MasterWeights::kHost && host_begin_ == 0; }
  // Only this rank's ranges (kSharded, kHostSharded).
  bool sharded() const {
    return master_place_ == MasterWeights::kSharded ||
           master_place_ == MasterWeights::kHostSharded ||
           master_place_ == MasterWeights::kShardedCompute;
  }
  const std::vector<std::pair<size_t, size_t>>& shard() const { return shard_; }
  // fp32 elements the backend holds for the weights: all of them; the part before host_begin()
  // and the mirror (kHost); the shard outside the mirror, and the mirror (kSharded); the mirror
  // (kHostSharded); the weight buffers (kShardedCompute).
  size_t backend_elements() const;
  // fp32 elements of the weights in host memory (kHost, kHostSharded; 0 otherwise).
  size_t host_elements() const;
  const std::vector<ParamView>& views() const { return views_; }
  const ParamView* Find(const std::string& name) const;
  // The fp32 weights the model computes with (backend memory); nullptr when this rank does not
  // hold the tensor. With kHost and kSharded only mirrored tensors (and with kHost those before
  // host_begin()) have them (asking for another aborts); with kShardedCompute every tensor, in
  // its bucket's slot or whole buffer.
  float* Param(const std::string& name);
  // Where the mirror holds flat index `flat` (kHost, kSharded), or null when it does not.
  float* MirrorAt(size_t flat) const;
  // With kHost: copies [begin, end) of the host weights to the mirror where it overlaps
  // mirrored tensors (Ops::CopyFromHostAsync); returns the last copy's ticket, 0 when none.
  uint64_t RefreshMirror(size_t begin, size_t end);
  // A host copy of the whole fp32 weights (kWhole, kHost), for checkpoints.
  std::vector<float> HostData() const;
  // `host` may be the view's own place in data() when that is host memory (read in place). With
  // kSharded it writes this rank's part, the mirror and the bf16 copy.
  void SetFromHost(const ParamView& view, const float* host);
  Ops* ops() const { return ops_; }
  const ckpt::ModelLayout& layout() const { return layout_; }
  // Where the backward adds the tensor's gradient (GradBuffers::At), or null when this rank does
  // not hold it.
  float* Grad(const std::string& name);

  // The bf16 copy of the whole buffer the bf16 model computes with (device memory, owned by the
  // model that sets it, or with kSharded by this store; null without, and null when it is kept
  // as WeightBuffers). The optimizer writes it beside the fp32 weights it steps.
  uint16_t* bf16_copy() const { return bf16_copy_; }
  // Where the bf16 model reads flat index `flat` of the bf16 copy (null without one), and where
  // the step writes this rank's: the same place, but with the copy kept as WeightBuffers a layer
  // bucket's slot and this rank's part's storage (up to the part's end).
  uint16_t* Bf16At(size_t flat) const;
  uint16_t* Bf16Owned(size_t flat) const;
  // Bytes of backend memory the bf16 copy takes when this store holds it, else 0.
  size_t bf16_backend_bytes() const;
  void set_bf16_copy(uint16_t* p) { bf16_copy_ = p; }
  // Counts changes of the fp32 weights: every optimizer step (which also writes the bf16 copy of
  // what it stepped) and every wholesale rewrite (initialisation, loading), after which a bf16
  // copy must be converted anew. weights_rewritten() is the count at the last rewrite.
  void WeightsStepped() { ++weights_version_; }
  uint64_t weights_version() const { return weights_version_; }
  uint64_t weights_rewritten() const { return weights_rewritten_; }

 private:
  void WeightsRewritten() { weights_rewritten_ = ++weights_version_; }
  void Write(const ParamView& view, const float* host);
  Ops* ops_;
  const ckpt::ModelLayout& layout_;
  int tp_rank_;
  MasterWeights master_place_;
  std::vector<ParamView> views_;
  float* master_ = nullptr;  // the fp32 weights (backend or pinned host memory), or the shard's;
                             // with kHost those from host_begin_ on
  float* device_master_ = nullptr;  // kHost: the fp32 weights before host_begin_ (backend)
  size_t host_begin_ = 0;
  float* mirror_ = nullptr;  // kHost, kSharded: the mirrored tensors' fp32 copies, backend memory
  std::unique_ptr<GradBuffers> grads_;
  std::unique_ptr<WeightBuffers> weights_;
  size_t size_ = 0, mirror_size_ = 0;
  // kSharded: the ranges kept; the same cut where mirrored tensors begin and end, in flat order,
  // each with where it lives (master_ or the mirror); and how much of master_ they use.
  struct Run {
    size_t begin, end;
    float* at;
  };
  const Run* RunOf(size_t flat) const;  // null when `flat` is not in the shard
  std::vector<std::pair<size_t, size_t>> shard_;
  bool shard_set_ = false;
  std::vector<Run> runs_;
  size_t shard_size_ = 0;
  uint16_t* bf16_copy_ = nullptr;
  float* own_bf16_ = nullptr;  // kSharded: the bf16 copy's memory (backend, ceil(size / 2) floats)
  uint64_t weights_version_ = 0, weights_rewritten_ = 0;
};

// A contiguous range of the flat buffers that data parallelism reduces as one piece (a bucket):
// the parameters of decoder layers [first_layer, last_layer] of one model chunk (indices relative
// to the chunk's first layer), ready for reduction once the backward has finished first_layer; or,
// with first_layer < 0, the chunk's embeddings or final norm and output layer, ready at the end.
// With the distributed optimizer each data-parallel rank owns one part of every bucket.
struct DpBucket {
  size_t offset = 0, numel = 0;
  int first_layer = -1, last_layer = -1;
  // [begin, end) of the flat buffers that data-parallel rank `rank` of `size` owns: the bucket cut
  // into `size` runs of ceil(numel / size) (the last ones may be shorter or empty).
  std::pair<size_t, size_t> Part(int rank, int size) const;
};

// The parts of `buckets` that data-parallel rank `rank` of `size` owns, non-empty, in flat order.
std::vector<std::pair<size_t, size_t>> DpOwnedParts(const std::vector<DpBucket>& buckets, int rank,
                                                    int size);

// One model chunk's buckets, in the backward's order: its layers [first_layer, last_layer) from
// the last down, neighbours merged up to `bucket_elements` (the lowest layer alone: its bucket is
// exposed at the end of the backward), then the embeddings (`first_chunk`:
// the first stage's first chunk) or the final norm and output layer (`last_chunk`).
std::vector<DpBucket> PlanDpBuckets(const ParamStore& params, int first_layer, int last_layer,
                                    bool first_chunk, bool last_chunk, size_t bucket_elements);

// When to start the data-parallel reduction overlapped with the backward. A reduction running
// beside the compute slows it for as long as it is under way, whatever its bytes (two H200s held
// at their 700 W power cap: the SM clock drops by 2–6% while the transfers run), so it should
// start as late as still lets it end with the backward. From a measured step: `left_ms[l]`, how
// long the backward went on after it had finished chunk layer l (it runs from the top layer down,
// so this grows with l), and `reduce_ms`, how long the layer buckets' reduction kept the
// communication stream busy. Returns the lowest layer that leaves kDpReduceMargin times the
// reduction (the buckets wait until the backward has finished it), or -1 when none does or
// nothing was measured (every bucket starts as soon as it is ready).
inline constexpr double kDpReduceMargin = 2.0;
int DpReduceStartLayer(const std::vector<double>& left_ms, double reduce_ms);

// One decoder layer's tensors as the models compute with them: the linear layers' weights and
// biases as `Linear` (the bf16 model uses its bf16 copy), the norms' in fp32, every gradient fp32.
// A pointer is null where the architecture has no such tensor (no biases, RMSNorm).
template <typename Linear>
struct LayerTensors {
  int global_index = 0;
  const float *ln1_w = nullptr, *ln1_b = nullptr, *ln2_w = nullptr, *ln2_b = nullptr;
  const Linear *qkv_w = nullptr, *qkv_b = nullptr, *proj_w = nullptr, *proj_b = nullptr;
  const Linear *fc1_w = nullptr, *fc1_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;
  float *d_ln1_w = nullptr, *d_ln1_b = nullptr, *d_ln2_w = nullptr, *d_ln2_b = nullptr;
  float *d_qkv_w = nullptr, *d_qkv_b = nullptr, *d_proj_w = nullptr, *d_proj_b = nullptr;
  float *d_fc1_w = nullptr, *d_fc1_b = nullptr, *d_fc2_w = nullptr, *d_fc2_b = nullptr;
};

// Binds layer `layer`'s tensors by their Megatron-Core names into `w` (a LayerTensors):
// `linear(name)` gives the linear layers' weights and biases, `norm(name)` the norms', `grad(name)`
// every gradient (each may return null when this rank does not hold the tensor).
template <typename W, typename Linear, typename Norm, typename Grad>
void BindLayerTensors(W* w, int layer, Linear&& linear, Norm&& norm, Grad&& grad) {
  w->global_index = layer;
  const std::string pre = "decoder.layers." + std::to_string(layer) + ".";
  const std::string ln1 = pre + "input_layernorm.", ln2 = pre + "pre_mlp_layernorm.";
  const std::string qkv = pre + "self_attention.linear_qkv.";
  const std::string proj = pre + "self_attention.linear_proj.";
  const std::string fc1 = pre + "mlp.linear_fc1.", fc2 = pre + "mlp.linear_fc2.";
  w->ln1_w = norm(ln1 + "weight");
  w->ln1_b = norm(ln1 + "bias");
  w->ln2_w = norm(ln2 + "weight");
  w->ln2_b = norm(ln2 + "bias");
  w->qkv_w = linear(qkv + "weight");
  w->qkv_b = linear(qkv + "bias");
  w->proj_w = linear(proj + "weight");
  w->proj_b = linear(proj + "bias");
  w->fc1_w = linear(fc1 + "weight");
  w->fc1_b = linear(fc1 + "bias");
  w->fc2_w = linear(fc2 + "weight");
  w->fc2_b = linear(fc2 + "bias");
  w->d_ln1_w = grad(ln1 + "weight");
  w->d_ln1_b = grad(ln1 + "bias");
  w->d_ln2_w = grad(ln2 + "weight");
  w->d_ln2_b = grad(ln2 + "bias");
  w->d_qkv_w = grad(qkv + "weight");
  w->d_qkv_b = grad(qkv + "bias");
  w->d_proj_w = grad(proj + "weight");
  w->d_proj_b = grad(proj + "bias");
  w->d_fc1_w = grad(fc1 + "weight");
  w->d_fc1_b = grad(fc1 + "bias");
  w->d_fc2_w = grad(fc2 + "weight");
  w->d_fc2_b = grad(fc2 + "bias");
}

// The tensors of a pipeline stage outside its decoder layers, as both models hold them: the
// embeddings (first stage), the final norm and the output layer (last stage) with their gradients.
// `Out` is the output layer's weight type (the bf16 model computes with its bf16 copy).
template <typename Out>
struct StageTensors {
  const float *word_emb = nullptr, *pos_emb = nullptr, *lnf_w = nullptr, *lnf_b = nullptr;
  const Out* out_w = nullptr;
  float *d_word_emb = nullptr, *d_pos_emb = nullptr, *d_lnf_w = nullptr, *d_lnf_b = nullptr,
        *d_out_w = nullptr;
};

// Binds them by their Megatron-Core names: `output(name)` gives the output layer's weight,
// `weight(name)` the others, `grad(name)` every gradient. With tied embeddings on one stage the
// output layer is the word embedding itself (one gradient for both uses); on several stages the
// last one holds its own copy (kept equal by the optimizer).
template <typename Out, typename Output, typename Weight, typename Grad>
StageTensors<Out> BindStageTensors(const ParamStore& params, bool first_stage, bool last_stage,
                                   Output&& output, Weight&& weight, Grad&& grad) {
  StageTensors<Out> t;
  if (first_stage) {
    t.word_emb = weight("embedding.word_embeddings.weight");
    t.pos_emb = weight("embedding.position_embeddings.weight");
    t.d_word_emb = grad("embedding.word_embeddings.weight");
    t.d_pos_emb = grad("embedding.position_embeddings.weight");
  }
  if (last_stage) {
    t.lnf_w = weight("decoder.final_layernorm.weight");
    t.lnf_b = weight("decoder.final_layernorm.bias");
    t.d_lnf_w = grad("decoder.final_layernorm.weight");
    t.d_lnf_b = grad("decoder.final_layernorm.bias");
    const char* out = params.Find("output_layer.weight") != nullptr
                          ? "output_layer.weight"
                          : "embedding.word_embeddings.weight";
    t.out_w = output(out);
    t.d_out_w = grad(out);
  }
  return t;
}

// Deterministic standard normals for a named tensor (counter-based, Box-Muller in float64).
void FillNormal(uint64_t seed, const std::string& name, double std, std::vector<float>* out);

}  // namespace leantron::trainer
