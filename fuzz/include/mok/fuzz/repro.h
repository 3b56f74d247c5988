// Repro files: a shrunk counterexample as a golden file (golden format v1, mok/golden/golden.h) whose
// description names the property, its parameters and the planted fault, so `mok-fuzz --replay FILE`
// re-runs exactly that check on exactly those inputs.
#pragma once

#include <filesystem>
#include <string>

#include "mok/fuzz/backend.h"
#include "mok/fuzz/compare.h"
#include "mok/fuzz/fuzz_case.h"

namespace mok::fuzz {

struct Repro {
  std::string property;
  ref::Problem problem;
  CaseParams params;
  std::string description;  // the golden's description: the failure and the case it shrank to
};

// Writes fc's problem with the reference's (fault-free) bits as its results. Throws mok::Error.
void write_repro(const std::filesystem::path& file, const std::string& property, const FuzzCase& fc,
                 const std::string& failure);

Repro read_repro(const std::filesystem::path& file);  // throws mok::Error

// The repro's property on its problem and parameters.
Verdict replay(Backend& backend, const Repro& repro);

}  // namespace mok::fuzz
