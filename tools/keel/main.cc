// keel — the command line. Subcommands live in cmd_*.cc and register through commands.h.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>

#include "tools/keel/commands.h"

namespace keel::cli {

std::unique_ptr<Environment> make_environment(const Globals& g) {
  EnvironmentOptions opts;
  for (const auto& p : g.plugin_paths) opts.plugin_paths.emplace_back(p);
  opts.threads = g.threads;
  auto env = Environment::create(opts);
  if (!env.is_ok()) {
    std::cerr << "keel: cannot start the runtime: " << env.status().to_string() << "\n";
    return nullptr;
  }
  return std::move(env).value();
}

}  // namespace keel::cli

int main(int argc, char** argv) {
  using namespace keel::cli;
  auto logger = spdlog::stderr_color_mt("keel");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%l] %v");

  CLI::App app{
      "keel — a deep-learning runtime: import, optimise and run models on CPU, GPU or many cards.\n"
      "Plugins (devices, passes, collectives) are found through *.keel-plugin.toml manifests in\n"
      "--plugin-path, $KEEL_PLUGIN_PATH, ~/.local/lib/keel/plugins and <prefix>/lib/keel/plugins.",
      "keel"};
  app.set_version_flag("--version", std::string("keel ") + KEEL_VERSION + " (plugin ABI " +
                                        std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." +
                                        std::to_string(KEEL_PLUGIN_ABI_MINOR) + ")");
  Globals g;
  if (const char* lvl = std::getenv("KEEL_LOG_LEVEL")) g.log_level = lvl;
  app.add_option("--plugin-path", g.plugin_paths, "Extra directory to search for plugin manifests (repeatable)");
  app.add_option("--log-level", g.log_level, "Log level: trace, debug, info, warn, error, off (env KEEL_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--threads", g.threads, "Worker threads for kernels (0 = all cores)")->check(kNonNegative);
  app.require_subcommand(1);
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(g.log_level)); });

  add_plugins_command(app, g);
  add_demo_command(app, g);
  add_run_command(app, g);
  add_info_command(app, g);
  add_conformance_command(app, g);
  add_plugin_test_command(app, g);
  add_bench_command(app, g);
  add_optimize_command(app, g);
  add_prune_command(app, g);
  add_quantize_command(app, g);
  add_train_command(app, g);
  add_plot_command(app, g);
  add_launch_command(app, g);
  add_serve_command(app, g);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the help or the error. CLI11's own codes for a bad command line (105 for a failed check, 106
    // for a missing option, 109 for an extra argument, ...) become 2, the usage error of the exit codes above; a
    // command's own status (CLI::RuntimeError) and --help's 0 stay as they are.
    const int code = app.exit(e);
    if (code == 0 || dynamic_cast<const CLI::RuntimeError*>(&e) != nullptr) return code;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "keel: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
