#include "libckpt/megatron_args_writer.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"

namespace leantron::ckpt {
namespace {

void EmitJson(PickleWriter& p, simdjson::dom::element e, int depth) {
  using simdjson::dom::element_type;
  if (depth > 8) {
    p.None();
    return;
  }
  switch (e.type()) {
    case element_type::NULL_VALUE:
      p.None();
      break;
    case element_type::BOOL:
      p.Bool(bool(e));
      break;
    case element_type::INT64:
      p.Int(int64_t(e));
      break;
    case element_type::UINT64:
      p.Int(static_cast<int64_t>(uint64_t(e)));
      break;
    case element_type::DOUBLE:
      p.Float(double(e));
      break;
    case element_type::STRING:
      p.Str(std::string_view(e));
      break;
    case element_type::ARRAY:
      p.EmptyList();
      p.Mark();
      for (simdjson::dom::element x : simdjson::dom::array(e)) EmitJson(p, x, depth + 1);
      p.Appends();
      break;
    case element_type::OBJECT:
      p.EmptyDict();
      p.Mark();
      for (auto field : simdjson::dom::object(e)) {
        p.Str(field.key);
        EmitJson(p, field.value, depth + 1);
      }
      p.SetItems();
      break;
  }
}

// A value for the Namespace: nullopt writes None.
struct ArgValue {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kDtype } kind = kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
};
ArgValue Int(int64_t v) { return {ArgValue::kInt, false, v, 0, ""}; }
ArgValue Bool(bool v) { return {ArgValue::kBool, v, 0, 0, ""}; }
ArgValue Float(double v) { return {ArgValue::kFloat, false, 0, v, ""}; }
ArgValue Str(std::string v) { return {ArgValue::kStr, false, 0, 0, std::move(v)}; }
ArgValue NoneValue() { return {}; }

}  // namespace

// The saved arguments with the model and layout overridden by what this checkpoint holds.
void EmitMegatronArgs(PickleWriter& p, const MegatronArgs& args, const CheckpointMetadata& m,
                      const ModelLayout& layout, bool distributed_optimizer) {
  const ModelConfig& c = m.config;
  const ParallelConfig& par = m.parallel;
  std::vector<std::pair<std::string, ArgValue>> set = {
      {"num_layers", Int(c.num_layers)},
      {"hidden_size", Int(c.hidden_size)},
      {"ffn_hidden_size", Int(c.ffn_hidden_size)},
      {"num_attention_heads", Int(c.num_attention_heads)},
      {"group_query_attention", Bool(c.num_query_groups != c.num_attention_heads)},
      {"num_query_groups", Int(c.num_query_groups)},
      {"kv_channels", Int(c.kv_channels)},
      {"max_position_embeddings", Int(c.max_position_embeddings)},
      {"make_vocab_size_divisible_by", Int(c.make_vocab_size_divisible_by)},
      {"padded_vocab_size", Int(layout.padded_vocab_size())},
      {"vocab_size", Int(c.vocab_size)},
      {"normalization", Str(c.normalization == NormType::kRMSNorm ? "RMSNorm" : "LayerNorm")},
      {"norm_epsilon", Float(c.norm_epsilon)},
      {"swiglu", Bool(c.swiglu())},
      {"openai_gelu", Bool(c.activation == Activation::kGeluTanh)},
      {"squared_relu", Bool(false)},
      {"position_embedding_type",
       Str(c.position_embedding_type == PositionEmbedding::kRope ? "rope" : "learned_absolute")},
      {"add_position_embedding",
       Bool(c.position_embedding_type == PositionEmbedding::kLearnedAbsolute)},
      {"use_rotary_position_embeddings",
       Bool(c.position_embedding_type == PositionEmbedding::kRope)},
      {"rotary_base", c.rotary_base == static_cast<double>(static_cast<int64_t>(c.rotary_base))
                          ? Int(static_cast<int64_t>(c.rotary_base))
                          : Float(c.rotary_base)},
      {"rotary_percent", Float(1.0)},
      {"use_rope_scaling", Bool(c.rope_scaling.llama3)},
      {"rope_scaling_factor", Float(c.rope_scaling.factor)},
      {"add_bias_linear", Bool(c.add_bias_linear)},
      {"add_qkv_bias", Bool(c.add_qkv_bias)},
      {"untie_embeddings_and_output_weights", Bool(c.untie_embeddings_and_output_weights)},
      {"bf16", Bool(c.params_dtype == DType::kBF16)},
      {"fp16", Bool(c.params_dtype == DType::kF16)},
      {"params_dtype",
       {ArgValue::kDtype, false, 0, 0, std::string(TorchDtypeName(c.params_dtype))}},
      {"tensor_model_parallel_size", Int(par.tp)},
      {"pipeline_model_parallel_size", Int(par.pp)},
      {"virtual_pipeline_model_parallel_size", par.vpp > 1 ? Int(par.vpp) : NoneValue()},
      {"num_layers_per_virtual_pipeline_stage",
       par.vpp > 1 ? Int(c.num_layers / (par.pp * par.vpp)) : NoneValue()},
      {"decoder_first_pipeline_num_layers",
       par.first_stage_layers > 0 ? Int(par.first_stage_layers) : NoneValue()},
      {"decoder_last_pipeline_num_layers",
       par.last_stage_layers > 0 ? Int(par.last_stage_layers) : NoneValue()},
      {"use_distributed_optimizer", Bool(distributed_optimizer)},
      // distrib_optim.pt is laid out for one DDP bucket.
      {"overlap_grad_reduce", Bool(false)},
      {"ddp_bucket_size", NoneValue()},
      {"ckpt_format", Str("torch")},
      {"consumed_train_samples", Int(m.consumed_samples)},
      {"iteration", Int(std::max<int64_t>(m.iteration, 0))},
  };
  absl::flat_hash_set<std::string> overridden;
  for (const auto& [key, value] : set) overridden.insert(key);
  p.Global("argparse", "Namespace");
  p.EmptyTuple();
  p.NewObj();
  p.EmptyDict();
  p.Mark();
  if (args.ok()) {
    for (auto field : args.object()) {
      const std::string key(field.key);
      if (overridden.contains(key)) continue;
      p.Str(key);
      EmitJson(p, field.value, 0);
    }
  }
  for (const auto& [key, v] : set) {
    p.Str(key);
    switch (v.kind) {
      case ArgValue::kNone:
        p.None();
        break;
      case ArgValue::kBool:
        p.Bool(v.b);
        break;
      case ArgValue::kInt:
        p.Int(v.i);
        break;
      case ArgValue::kFloat:
        p.Float(v.f);
        break;
      case ArgValue::kStr:
        p.Str(v.s);
        break;
      case ArgValue::kDtype:
        p.Global("torch", v.s);
        break;
    }
  }
  p.SetItems();
  p.Build();
}

// Megatron's two param groups (weight decay on, off) as torch AdamW keeps them, plus Megatron's
// group keys; `params` the state indices (omitted for the distributed optimizer, which saves the
// step in each group instead).
void EmitMegatronParamGroups(PickleWriter& p, const MegatronArgs& args, int64_t step,
                             const std::vector<std::vector<int64_t>>* params) {
  const double lr = args.Number("lr").value_or(0.0);
  const double min_lr = args.Number("min_lr").value_or(0.0);
  p.EmptyList();
  p.Mark();
  for (int g = 0; g < 2; ++g) {
    p.EmptyDict();
    p.Mark();
    p.Str("lr");
    p.Float(lr);
    p.Str("betas");
    p.Mark();
    p.Float(args.Number("adam_beta1").value_or(0.9));
    p.Float(args.Number("adam_beta2").value_or(0.999));
    p.Tuple();
    p.Str("eps");
    p.Float(args.Number("adam_eps").value_or(1e-8));
    p.Str("weight_decay");
    p.Float(args.Number("weight_decay").value_or(0.01) * (g == 0 ? 1.0 : 0.0));
    for (const char* key : {"amsgrad", "maximize", "capturable", "differentiable"}) {
      p.Str(key);
      p.Bool(false);
    }
    p.Str("foreach");
    p.None();
    p.Str("fused");
    p.None();
    p.Str("decoupled_weight_decay");
    p.Bool(true);
    p.Str("wd_mult");
    p.Float(g == 0 ? 1.0 : 0.0);
    p.Str("lr_mult");
    p.Float(1.0);
    p.Str("is_expert_parallel");
    p.Bool(false);
    p.Str("default_config");
    p.Bool(true);
    p.Str("max_lr");
    p.Float(lr);
    p.Str("min_lr");
    p.Float(min_lr);
    p.Str("is_decoupled_lr");
    p.Bool(false);
    if (params != nullptr) {
      p.Str("params");
      p.EmptyList();
      p.Mark();
      for (int64_t i : (*params)[g]) p.Int(i);
      p.Appends();
    } else {
      p.Str("step");
      p.Int(step);
    }
    p.SetItems();
  }
  p.Appends();
}

// OptimizerParamScheduler.state_dict() as Megatron's get_optimizer_param_scheduler sets it up.
void EmitMegatronScheduler(PickleWriter& p, const MegatronArgs& args, const CheckpointMetadata& m) {
  const double gbs = args.Number("global_batch_size").value_or(1);
  const double train_iters = args.Number("train_iters").value_or(0);
  const double decay_iters = args.Number("lr_decay_iters").value_or(train_iters);
  const double decay_steps = args.Number("lr_decay_samples").value_or(decay_iters * gbs);
  double warmup_steps =
      args.Number("lr_warmup_samples").value_or(args.Number("lr_warmup_iters").value_or(0) * gbs);
  if (auto fraction = args.Number("lr_warmup_fraction")) warmup_steps = *fraction * decay_steps;
  const double wd = args.Number("weight_decay").value_or(0.01);
  auto num = [&](double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v))) {
      p.Int(static_cast<int64_t>(v));
    } else {
      p.Float(v);
    }
  };
  p.EmptyDict();
  p.Mark();
  p.Str("max_lr");
  p.Float(args.Number("lr").value_or(0.0));
  p.Str("lr_warmup_steps");
  num(warmup_steps);
  p.Str("num_steps");
  p.Int(m.consumed_samples);
  p.Str("lr_decay_style");
  p.Str(args.String("lr_decay_style").value_or("linear"));
  p.Str("lr_decay_steps");
  num(decay_steps);
  p.Str("min_lr");
  p.Float(args.Number("min_lr").value_or(0.0));
  p.Str("start_wd");
  p.Float(args.Number("start_weight_decay").value_or(wd));
  p.Str("end_wd");
  p.Float(args.Number("end_weight_decay").value_or(wd));
  p.Str("wd_incr_style");
  p.Str(args.String("weight_decay_incr_style").value_or("constant"));
  p.Str("wd_incr_steps");
  num(args.Number("train_samples").value_or(train_iters * gbs));
  p.SetItems();
}

}  // namespace leantron::ckpt
