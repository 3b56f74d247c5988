// A command-line tool run by a test: its exit status and what it printed (stdout and stderr together).
// For the tests of the tools above core (their CMake adds this folder to the include path).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mok::test {

struct ToolRun {
  int status;          // the exit status, -1 if it did not exit normally
  std::string output;  // stdout and stderr
};

// std::system's or pclose's raw status as ToolRun's status.
inline int exit_status_of(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1; }

// `tool args`, killed after timeout_s seconds (status 124), its stderr folded into its stdout.
inline ToolRun run_tool_command(const std::string& tool, const std::string& args, int timeout_s) {
  const std::string command = "timeout " + std::to_string(timeout_s) + " " + tool + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), pipe)) > 0;) output.append(buf.data(), n);
  return {exit_status_of(pclose(pipe)), output};
}

}  // namespace mok::test
