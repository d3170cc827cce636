#include "core/base/options.h"

namespace keel {
namespace {
template <typename T>
const T* get(const keel_options_t* o, const char* key) {
  if (o == nullptr || key == nullptr) return nullptr;
  auto it = o->values.find(key);
  if (it == o->values.end()) return nullptr;
  return std::get_if<T>(&it->second);
}
int get_int(const keel_options_t* o, const char* key, int64_t* out) {
  if (auto* v = get<int64_t>(o, key)) {
    *out = *v;
    return 1;
  }
  return 0;
}
int get_float(const keel_options_t* o, const char* key, double* out) {
  if (auto* v = get<double>(o, key)) {
    *out = *v;
    return 1;
  }
  if (auto* v = get<int64_t>(o, key)) {
    *out = static_cast<double>(*v);
    return 1;
  }
  return 0;
}
int get_bool(const keel_options_t* o, const char* key, int* out) {
  if (auto* v = get<bool>(o, key)) {
    *out = *v ? 1 : 0;
    return 1;
  }
  return 0;
}
int get_string(const keel_options_t* o, const char* key, const char** out) {
  if (auto* v = get<std::string>(o, key)) {
    *out = v->c_str();
    return 1;
  }
  return 0;
}
int get_string_at(const keel_options_t* o, const char* key, size_t i, const char** out) {
  if (auto* v = get<std::vector<std::string>>(o, key); v && i < v->size()) {
    *out = (*v)[i].c_str();
    return 1;
  }
  return 0;
}
}  // namespace

const keel_options_api_t* options_api() {
  static const keel_options_api_t api = {
      sizeof(keel_options_api_t), get_int, get_float, get_bool, get_string, get_string_at};
  return &api;
}
}  // namespace keel
