// keel/train.hpp — Keel's C++ training API: the one header a training program includes.
//
//   find_package(Keel REQUIRED COMPONENTS train)   target_link_libraries(app PRIVATE keel::train)
//   pkg-config --cflags --libs keel-train          (C++20)
//
// What it gives (the same classes `keel train` is written with):
//   keel::eager         Tensor (eager tensors, autograd), the ops, custom_function (a differentiable function of
//                       the program's own), NoGradGuard, AutocastGuard (bf16/fp16), Tracer
//   keel::train::nn     Module, Linear, Conv2D, ConvTranspose2D, BatchNorm2D, LayerNorm, Dropout, Embedding,
//                       MaxPool2D, AvgPool2D, ReLU/GELU/Sigmoid/Tanh, Flatten, Sequential, the losses
//                       (CrossEntropyLoss, MSELoss, BCEWithLogitsLoss; knowledge distillation's distillation_kl and
//                       DistillationLoss)
//   keel::train         SGD, Adam/AdamW, LR schedulers, GradScaler, clip_grad_norm_; Dataset, TensorDataset,
//                       FashionMnist, DataLoader (worker threads), DistributedSampler; safetensors checkpoints and
//                       capture/restore_checkpoint; trace_module/export_onnx; OnnxModule (an ONNX model as a
//                       trainable module: freeze, replace_head); init_runtime; ScalarLogger (the log
//                       `keel plot` draws), RunRecord (run.json), histograms, render_runs_html; DataParallel
//                       over a dist::ProcessGroup (core/runtime/dist; gradient compression), sync_batch_norm
//                       (SyncBatchNorm) and all_reduce_sum (a differentiable sum across ranks)
//   keel                Status/StatusOr, Tensor (host/device storage), Shape, DType, Environment, Graph, Session,
//                       load_onnx/save_onnx
//
// Stability (ARCHITECTURE.md, "The installed C++ training API"):
//   - Source compatibility: the names above, as declared in the headers this one includes, keep their meaning and
//     signatures within a minor release series (0.1.x); a change comes with a minor release and is listed in the
//     README's changes. Members documented "Internal", namespaces named detail and private members are not part of
//     the promise.
//   - Binary compatibility: none across releases. libkeel_train.so and libkeel_core.so are C++ libraries without a
//     curated ABI (like libtorch): a program built against release X runs with release X; rebuild on upgrade.
//     find_package(Keel COMPONENTS train) checks nothing at run time, so ship the program with the Keel it was
//     built against (the install tree is relocatable).
//   - One core per process: a program that links keel::train gets Keel's C API (keel.h) from libkeel_core.so as
//     well, and must not also link keel::keel (libkeel.so): CMake refuses the combination (KEEL_CORE_LIBRARY).
//
// Errors: eager ops and module forward passes throw keel::eager::Error (a Status inside); everything that reads
// files or data returns Status/StatusOr. Threading: see each header (a Module is used by one thread at a time; the
// DataLoader's workers are internal).
#pragma once

#if __cplusplus < 202002L
#error "keel/train.hpp needs C++20 (-std=c++20; CMake: target_compile_features(... cxx_std_20), which keel::train sets)"
#endif

#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/dist/process_group.h"
#include "core/runtime/eager.h"
#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "core/train/checkpoint.h"
#include "core/train/data.h"
#include "core/train/data_parallel.h"
#include "core/train/export.h"
#include "core/train/idx.h"
#include "core/train/nn.h"
#include "core/train/onnx_module.h"
#include "core/train/optim.h"
#include "core/train/run_plot.h"
#include "core/train/run_record.h"
#include "core/train/scalar_log.h"
#include "core/train/trainer.h"
