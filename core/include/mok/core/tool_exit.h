// A command-line tool's exit status: what it wrote to standard output must have reached it. A report, table
// or verdict lost to a full disk or a closed pipe is no success (mok-bench --plan > /dev/full exited 0).
// And its --help. Shared by every tool of every module, so here at the bottom of the build.
#pragma once

#include <cstdio>
#include <iostream>
#include <string_view>

namespace mok {

// Whether what was written to standard output (through stdio or std::cout) failed to reach it. Flushes
// both first.
inline bool standard_output_lost() {
  std::cout.flush();
  return std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout;
}

// `status`, or 2 where standard output was lost (said on standard error, naming the tool).
inline int tool_exit_status(const char* tool, int status) {
  if (!standard_output_lost()) return status;
  std::cerr << tool << ": cannot write to standard output" << std::endl;
  return 2;
}

// Whether the tool was asked for --help or -h as its only argument: then `usage` is printed on standard
// output, and the tool returns 0 (mok-bench and mok-procs took it for an option without its value, the probes
// for a bad argument: exit 2). With other arguments it is no option.
inline bool printed_help(int argc, char** argv, const char* usage) {
  if (argc != 2 || (std::string_view(argv[1]) != "--help" && std::string_view(argv[1]) != "-h")) return false;
  std::fputs(usage, stdout);
  return true;
}

}  // namespace mok
