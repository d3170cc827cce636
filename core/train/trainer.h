// keel/core/train/trainer.h — capturing and restoring everything a training run needs to resume exactly.
//
// A resumed run reproduces the uninterrupted one bit for bit when it restores: the model (parameters and buffers),
// the optimizer (per-parameter state and step counts, learning rates), the scheduler's step, the loss scaler, the
// position (epoch, next batch in the epoch, global step), the data order (the loader's seed: the order of an epoch is
// a function of seed and epoch), and the global generator (dropout masks, random init).
// Thread-safety: call from the training thread.
#pragma once

#include <cstdint>

#include "core/train/checkpoint.h"
#include "core/train/nn.h"
#include "core/train/optim.h"

namespace keel::train {

struct Progress {
  int64_t epoch = 0;        // the epoch in progress (0-based)
  int64_t batch = 0;        // the next batch of that epoch
  int64_t global_step = 0;  // optimizer steps taken so far
  uint64_t data_seed = 0;   // the DataLoader's seed
  // The factor the optimizer's learning rates carry over the rate given for one process (data-parallel runs scale it
  // with the world size, `keel train --lr-scaling`), so that a run resumed at another world size can rescale them.
  double lr_scale = 1;
};

// Components "model", "optimizer", "scheduler" (when given), "scaler" (when given), "trainer" (progress + generator).
Checkpoint capture_checkpoint(const nn::Module& model, const Optimizer& opt, const LRScheduler* sched,
                              const GradScaler* scaler, const Progress& progress);
// Restores into already-built objects of the same structure. Errors name the component and the problem.
Status restore_checkpoint(const Checkpoint& ckpt, nn::Module& model, Optimizer& opt, LRScheduler* sched,
                          GradScaler* scaler, Progress& progress);

}  // namespace keel::train
