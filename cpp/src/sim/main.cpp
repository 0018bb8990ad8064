// speedmatrix-sim: the built-in engine's executable. See docs/internals.md §2.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "server.hpp"

namespace {

using speedmatrix::sim::ServerOptions;

const char kUsage[] =
    "usage: speedmatrix-sim --profile PATH.json [--host 127.0.0.1] [--port 0] [--flavour "
    "sglang|vllm]\n"
    "                       [--set key=value ...] [--unpaced] [--stamp]\n"
    "                       [--fault-http500 P] [--fault-malformed P] [--fault-drop P] "
    "[--fault-stall P]\n"
    "                       [--seed N] [--watch-stdin] [--api-key KEY] [--reasoning-tokens N]\n"
    "The key may also come from $SPEEDMATRIX_SIM_API_KEY (kept out of the process list).\n";

// 4096 concurrent streams need more descriptors than the usual soft limit.
void raise_nofile() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

bool parse_port(const char* s, int& out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end != '\0' || end == s || v < 0 || v > 65535) return false;
  out = static_cast<int>(v);
  return true;
}

bool parse_share(const char* s, double& out) {
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end && *end == '\0' && out >= 0.0 && out <= 1.0;
}

struct Args {
  speedmatrix::sim::ServerOptions opt;
  std::string profile_path, flavour;
  std::vector<std::string> sets;
};

// Reads the command line into args; an exit status when it ends here (a usage error: 2,
// --help: 0), -1 to go on.
int parse_args(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "speedmatrix-sim: %s needs a value\n%s", name, kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    auto share = [&](const char* name, double& out) {
      const char* v = value(name);
      if (!parse_share(v, out)) {
        std::fprintf(stderr, "speedmatrix-sim: %s wants a share in [0, 1], got '%s'\n", name, v);
        std::exit(2);
      }
    };
    if (a == "--profile")
      args.profile_path = value("--profile");
    else if (a == "--host")
      args.opt.host = value("--host");
    else if (a == "--port") {
      const char* v = value("--port");
      if (!parse_port(v, args.opt.port)) {
        std::fprintf(stderr, "speedmatrix-sim: --port wants 0..65535, got '%s'\n", v);
        return 2;
      }
    } else if (a == "--api-key")
      args.opt.api_key = value("--api-key");
    else if (a == "--flavour" || a == "--flavor")
      args.flavour = value("--flavour");
    else if (a == "--set")
      args.sets.emplace_back(value("--set"));
    else if (a == "--unpaced")
      args.opt.unpaced = true;
    else if (a == "--stamp")
      args.opt.stamp = true;
    else if (a == "--watch-stdin")
      args.opt.watch_stdin = true;
    else if (a == "--fault-http500")
      share("--fault-http500", args.opt.fault_http500);
    else if (a == "--fault-malformed")
      share("--fault-malformed", args.opt.fault_malformed);
    else if (a == "--fault-drop")
      share("--fault-drop", args.opt.fault_drop);
    else if (a == "--fault-stall")
      share("--fault-stall", args.opt.fault_stall);
    else if (a == "--reasoning-tokens") {
      const char* v = value("--reasoning-tokens");
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (end == v || *end != '\0' || n < 0) {
        std::fprintf(stderr, "speedmatrix-sim: --reasoning-tokens wants a count >= 0, got '%s'\n",
                     v);
        return 2;
      }
      args.opt.reasoning_tokens = n;
    } else if (a == "--reasoning-hidden")  // not in the usage: a test mode (issue 23)
      args.opt.reasoning_hidden = true;
    else if (a == "--seed")
      args.opt.seed = std::strtoull(value("--seed"), nullptr, 10);
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "speedmatrix-sim: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  return -1;
}

// What the flags cannot say alone: the key from the environment, the shares' sum.
int check_args(Args& args) {
  if (const char* k = std::getenv("SPEEDMATRIX_SIM_API_KEY"); k && *k && args.opt.api_key.empty())
    args.opt.api_key = k;
  const ServerOptions& opt = args.opt;
  double faults = opt.fault_http500 + opt.fault_malformed + opt.fault_drop + opt.fault_stall;
  if (faults > 1.0 + 1e-9) {
    std::fprintf(stderr,
                 "speedmatrix-sim: the fault shares add up to %g; a request gets at most one "
                 "fault, so they must add up to 1 or less\n",
                 faults);
    return 2;
  }
  if (args.profile_path.empty()) {
    std::fprintf(stderr, "speedmatrix-sim: --profile is required\n%s", kUsage);
    return 2;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (int status = parse_args(argc, argv, args); status >= 0) return status;
  if (int status = check_args(args); status >= 0) return status;
  if (!args.flavour.empty()) args.sets.push_back("flavour=\"" + args.flavour + "\"");
  try {
    args.opt.profile = speedmatrix::sim::load_profile(args.profile_path, args.sets);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speedmatrix-sim: %s\n", e.what());
    return 2;
  }
  raise_nofile();
  return speedmatrix::sim::run_server(args.opt);
}
