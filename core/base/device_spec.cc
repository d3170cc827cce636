#include "core/base/device_spec.h"

#include <cctype>

namespace keel {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

StatusOr<DeviceSpec> DeviceSpec::parse(std::string_view text) {
  const std::string_view spec = trim(text);
  const std::string quoted = "device '" + std::string(text) + "'";
  const char* form = " (write TYPE or TYPE:INDEX, e.g. cpu, cuda:1)";
  if (spec.empty()) return invalid_argument("empty device" + std::string(form));
  DeviceSpec out;
  const size_t colon = spec.find(':');
  std::string_view type = spec.substr(0, colon);
  if (type.empty()) return invalid_argument(quoted + ": no device type" + form);
  if (!std::isalpha(static_cast<unsigned char>(type.front()))) {
    return invalid_argument(quoted + ": a device type starts with a letter" + form);
  }
  for (char c : type) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      return invalid_argument(quoted + ": '" + std::string(1, c) + "' is not allowed in a device type" + form);
    }
  }
  out.type.reserve(type.size());
  for (char c : type) out.type.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (colon == std::string_view::npos) return out;
  std::string_view idx = spec.substr(colon + 1);
  if (idx.empty()) return invalid_argument(quoted + ": no index after ':'" + form);
  if (idx.front() == '-') return invalid_argument(quoted + ": the index must be >= 0" + form);
  int64_t v = 0;
  for (char c : idx) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      return invalid_argument(quoted + ": the index '" + std::string(idx) + "' is not a number" + form);
    }
    v = v * 10 + (c - '0');
    if (v > INT32_MAX) return invalid_argument(quoted + ": the index is too large");
  }
  out.index = static_cast<int32_t>(v);
  out.explicit_index = true;
  return out;
}

Status DeviceSpec::check(const Registry& reg) const {
  const DeviceEntry* dev = reg.device(type);
  if (dev == nullptr) {
    std::string known;
    for (const auto& t : reg.device_types()) known += (known.empty() ? "" : ", ") + t;
    return not_found("device '" + to_string() + "': no device type '" + type + "' is available (devices: " + known +
                     "; see `keel plugins`)");
  }
  if (index < 0 || index >= dev->device_count) {
    const int32_t n = dev->device_count;
    return Status(StatusCode::kOutOfRange, "device '" + to_string() + "' does not exist: there " +
                                               (n == 1 ? "is " : "are ") + std::to_string(n) + " " + type + " device" +
                                               (n == 1 ? "" : "s") +
                                               (n > 0 ? " (indices 0.." + std::to_string(n - 1) + ")" : std::string()));
  }
  return Status::ok();
}

StatusOr<DeviceSpec> DeviceSpec::resolve(const Registry& reg, std::string_view spec) {
  KEEL_ASSIGN_OR_RETURN(DeviceSpec d, parse(spec), "");
  KEEL_RETURN_IF_ERROR(d.check(reg), "");
  return d;
}

}  // namespace keel
