// keel/core/train/checkpoint.h — the safetensors file format and training checkpoints built on it.
//
// safetensors (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N, N bytes of JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
// (padded with spaces to a multiple of 8), then the raw little-endian tensor bytes; offsets are relative to the end of
// the header, contiguous, without holes or overlaps. Any safetensors reader (Python `safetensors`, Rust, candle)
// opens Keel checkpoints, and Keel opens theirs.
//
// A Checkpoint is a set of named components ("model", "optimizer", "scheduler", "scaler", "trainer", ...), each
// a State: tensors (saved as "<component>/<name>") and a JSON object of scalars (saved as metadata "<component>",
// a JSON string, since safetensors metadata values are strings). Writes are atomic (a temporary file renamed over the
// target), so a crash never leaves half a checkpoint.
//
// Every malformed file (short, header length past the end, bad JSON, unknown dtype, offsets out of bounds, holes,
// overlaps, shape/size mismatch) is an INVALID_ARGUMENT naming the file and the problem.
// Thread-safety: free functions are thread-safe; a Checkpoint is a value (thread-compatible).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/eager.h"

namespace keel::train {

struct SafeTensors {
  std::vector<std::pair<std::string, keel::Tensor>> tensors;  // host tensors, in file order
  std::map<std::string, std::string> metadata;
};

// The file's bytes. Tensors must be on the host with a dtype safetensors names (f32 f16 bf16 f64 i8..i64 u8..u64 bool).
StatusOr<std::string> serialize_safetensors(const SafeTensors& st);
StatusOr<SafeTensors> parse_safetensors(std::string_view bytes, const std::string& origin);
Status save_safetensors(const std::filesystem::path& file, const SafeTensors& st);
StatusOr<SafeTensors> load_safetensors(const std::filesystem::path& file);

// What one component saves: tensors (eager tensors; copied to the host when saved) and scalars.
struct State {
  std::vector<std::pair<std::string, eager::Tensor>> tensors;
  nlohmann::json values = nlohmann::json::object();
  const eager::Tensor* tensor(const std::string& name) const;
};

class Checkpoint {
 public:
  void put(const std::string& component, State state) { components_[component] = std::move(state); }
  // nullptr when the checkpoint has no such component.
  const State* get(const std::string& component) const;
  // NOT_FOUND naming the file's components when missing.
  StatusOr<const State*> require(const std::string& component) const;
  const std::map<std::string, State>& components() const { return components_; }

  Status save(const std::filesystem::path& file) const;
  static StatusOr<Checkpoint> load(const std::filesystem::path& file);

 private:
  std::map<std::string, State> components_;
};

}  // namespace keel::train
