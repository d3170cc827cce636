#include "core/train/trainer.h"

#include <cmath>
#include <sstream>

namespace keel::train {

Checkpoint capture_checkpoint(const nn::Module& model, const Optimizer& opt, const LRScheduler* sched,
                              const GradScaler* scaler, const Progress& p) {
  Checkpoint c;
  State m;
  for (const auto& [n, t] : model.state_dict()) m.tensors.emplace_back(n, t);
  c.put("model", std::move(m));
  c.put("optimizer", opt.state_dict());
  if (sched) c.put("scheduler", sched->state_dict());
  if (scaler) c.put("scaler", scaler->state_dict());
  State t;
  std::ostringstream gen;
  gen << eager::generator();
  t.values = {{"epoch", p.epoch},         {"batch", p.batch},       {"global_step", p.global_step},
              {"data_seed", p.data_seed}, {"lr_scale", p.lr_scale}, {"generator", gen.str()}};
  c.put("trainer", std::move(t));
  return c;
}

Status restore_checkpoint(const Checkpoint& c, nn::Module& model, Optimizer& opt, LRScheduler* sched,
                          GradScaler* scaler, Progress& p) {
  KEEL_ASSIGN_OR_RETURN(const State* m, c.require("model"), "restore");
  StateDict sd(m->tensors.begin(), m->tensors.end());
  KEEL_RETURN_IF_ERROR(model.load_state_dict(sd), "restore model");
  KEEL_ASSIGN_OR_RETURN(const State* o, c.require("optimizer"), "restore");
  KEEL_RETURN_IF_ERROR(opt.load_state_dict(*o), "restore optimizer");
  if (sched) {
    KEEL_ASSIGN_OR_RETURN(const State* s, c.require("scheduler"), "restore");
    KEEL_RETURN_IF_ERROR(sched->load_state_dict(*s), "restore scheduler");
  }
  if (scaler) {
    KEEL_ASSIGN_OR_RETURN(const State* s, c.require("scaler"), "restore");
    KEEL_RETURN_IF_ERROR(scaler->load_state_dict(*s), "restore grad scaler");
  }
  KEEL_ASSIGN_OR_RETURN(const State* t, c.require("trainer"), "restore");
  try {
    p.epoch = t->values.at("epoch").get<int64_t>();
    p.batch = t->values.at("batch").get<int64_t>();
    p.global_step = t->values.at("global_step").get<int64_t>();
    p.data_seed = t->values.at("data_seed").get<uint64_t>();
    p.lr_scale = t->values.value("lr_scale", 1.0);  // absent in checkpoints written before it existed
    std::istringstream gen(t->values.at("generator").get<std::string>());
    std::mt19937_64 g;
    gen >> g;
    if (gen.fail()) return invalid_argument("restore: the checkpoint's generator state is malformed");
    eager::generator() = g;
  } catch (const std::exception& e) {
    return invalid_argument(std::string("restore: the checkpoint's trainer component is malformed: ") + e.what());
  }
  if (p.epoch < 0 || p.batch < 0 || p.global_step < 0)
    return invalid_argument("restore: negative epoch/batch/step in the checkpoint");
  if (!(p.lr_scale > 0) || !std::isfinite(p.lr_scale))
    return invalid_argument("restore: the checkpoint's learning-rate scale is not a positive number");
  return Status::ok();
}

}  // namespace keel::train
