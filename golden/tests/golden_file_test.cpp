// Golden files: bitwise round trip, atomic writes, and a clear mok::Error for every kind of bad file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <functional>
#include <optional>
#include <type_traits>

#include "mok/core/fields.h"
#include "mok/golden/atomic_file.h"
#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "test_files.h"

namespace mok::golden {
namespace {

using testing::RawGolden;
using testing::TempDir;

class GoldenFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { smoke_ = new GoldenCase(make_case(builtin_case())); }
  static void TearDownTestSuite() { delete smoke_; }

  // The message of the mok::Error that reading `file` throws ("" if it reads fine).
  static std::string read_error(const std::filesystem::path& file) {
    try {
      read_golden(file);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  static GoldenCase* smoke_;
  TempDir dir_{"golden-file-test"};
};

GoldenCase* GoldenFile::smoke_ = nullptr;

void expect_same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].dtype, b[i].dtype) << a[i].name;
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << a[i].name;
  }
}

void expect_same_case(const GoldenCase& a, const GoldenCase& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.generator, b.generator);
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.numerics_version, b.numerics_version);
  for_each_field(a.config, b.config, [](const char* name, const auto& x, const auto& y) {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(x)>>)
      EXPECT_EQ(bits_of(x), bits_of(y)) << name;
    else
      EXPECT_EQ(x, y) << name;
  });
  EXPECT_EQ(a.options.step, b.options.step);
  EXPECT_EQ(a.options.ring_rows, b.options.ring_rows);
  EXPECT_EQ(a.options.recompute, b.options.recompute);
  EXPECT_EQ(a.options.fp8_weight_gradients, b.options.fp8_weight_gradients);
  ASSERT_EQ(a.recipe.has_value(), b.recipe.has_value());
  if (a.recipe) {
    EXPECT_EQ(a.recipe->seed, b.recipe->seed);
    EXPECT_EQ(a.recipe->routing, b.recipe->routing);
    EXPECT_EQ(a.recipe->zipf_s, b.recipe->zipf_s);
  }
  ASSERT_EQ(a.oracle.size(), b.oracle.size());
  for (const auto& [name, accuracy] : a.oracle) {
    ASSERT_TRUE(b.oracle.count(name)) << name;
    EXPECT_EQ(accuracy.rel_error, b.oracle.at(name).rel_error) << name;
    EXPECT_EQ(accuracy.bound, b.oracle.at(name).bound) << name;
  }
  expect_same_tensors(a.inputs, b.inputs);
  expect_same_tensors(a.results.routing, b.results.routing);
  expect_same_tensors(a.results.outputs, b.results.outputs);
}

TEST_F(GoldenFile, RoundTripIsBitwise) {
  write_golden(dir_ / "a.h5", *smoke_);
  const GoldenCase back = read_golden(dir_ / "a.h5");
  expect_same_case(*smoke_, back);
  EXPECT_FALSE(back.oracle.empty());
  write_golden(dir_ / "b.h5", back);
  EXPECT_EQ(testing::read_bytes(dir_ / "a.h5"), testing::read_bytes(dir_ / "b.h5")) << "the writer is deterministic";
}

// A case with every field off its default (catalogue.h's key list): each key parses to its value (none
// reads as its default), and the case round-trips through a file and regenerates, so no field can be
// dropped by the writer and filled back by the reader's default.
TEST_F(GoldenFile, ACaseWithEveryFieldOffItsDefaultRoundTrips) {
  CaseSpec spec = parse_case_text(
      "description = every field set\nranks = 2\ntokens_per_rank = 8\nexperts = 8\nhidden = 128\n"
      "intermediate = 128\ntop_k = 3\nscore_mode = sigmoid\nrenormalize = false\nn_group = 4\ntopk_group = 2\n"
      "routed_scale = 2.5\nswiglu_limit = 0.75\nshared_intermediate = 128\nprecision = fp8\nstep = fp32_fma\n"
      "ring_rows = 128\nrecompute = true\nseed = 7\nrouting = zipf\nzipf_s = 1.5\n",
      "mem", "every_field");
  spec.options.fp8_weight_gradients = true;  // not a case-file key: fuzz repros carry it
  const CaseSpec defaults = parse_case_text("", "mem", "defaults");
  for_each_field(spec.config, defaults.config,
                 [](const char* name, const auto& set, const auto& unset) { EXPECT_NE(set, unset) << name; });
  EXPECT_NE(spec.description, defaults.description);
  EXPECT_NE(spec.options.step, defaults.options.step);
  EXPECT_NE(spec.options.ring_rows, defaults.options.ring_rows);
  EXPECT_NE(spec.options.recompute, defaults.options.recompute);
  EXPECT_NE(spec.recipe.seed, defaults.recipe.seed);
  EXPECT_NE(spec.recipe.routing, defaults.recipe.routing);
  EXPECT_NE(spec.recipe.zipf_s, defaults.recipe.zipf_s);
  const GoldenCase made = make_case(spec);
  write_golden(dir_ / "every.h5", made);
  const GoldenCase back = read_golden(dir_ / "every.h5");
  expect_same_case(made, back);
  expect_same_case(made, regenerate(back));
}

// Whether /config holds a precision attribute, and its value.
std::optional<std::string> stored_precision(const std::filesystem::path& file) {
  using testing::h5;
  const hid_t f = h5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen " + file.string());
  const hid_t config = h5(H5Gopen2(f, "config", H5P_DEFAULT), "H5Gopen2 /config");
  std::optional<std::string> out;
  if (h5(H5Aexists(config, "precision"), "H5Aexists /config@precision") > 0) {
    const hid_t attr = h5(H5Aopen(config, "precision", H5P_DEFAULT), "H5Aopen /config@precision");
    const hid_t type = h5(H5Aget_type(attr), "H5Aget_type /config@precision");
    char* value = nullptr;
    h5(H5Aread(attr, type, &value), "H5Aread /config@precision");
    if (!value) throw std::runtime_error("/config@precision holds no string");
    out = value;
    h5(H5free_memory(value), "H5free_memory /config@precision");
    h5(H5Tclose(type), "H5Tclose /config@precision");
    h5(H5Aclose(attr), "H5Aclose /config@precision");
  }
  h5(H5Gclose(config), "H5Gclose /config");
  h5(H5Fclose(f), "H5Fclose " + file.string());
  return out;
}

// An fp8 golden says so in /config@precision (and in its content hash); a bf16 golden carries no
// precision attribute, as every golden before the fp8 mode, and one without it reads as bf16.
TEST_F(GoldenFile, Fp8RoundTripsAndOnlyFp8StoresItsPrecision) {
  const GoldenCase fp8 = make_case(*find_case("fp8_smoke"));
  ASSERT_EQ(fp8.config.precision, Precision::fp8);
  write_golden(dir_ / "fp8.h5", fp8);
  const GoldenCase back = read_golden(dir_ / "fp8.h5");
  expect_same_case(fp8, back);
  expect_same_case(fp8, regenerate(back));
  EXPECT_EQ(stored_precision(dir_ / "fp8.h5"), "fp8");
  write_golden(dir_ / "bf16.h5", *smoke_);
  EXPECT_EQ(stored_precision(dir_ / "bf16.h5"), std::nullopt);
  EXPECT_EQ(read_golden(dir_ / "bf16.h5").config.precision, Precision::bf16);
}

// A case made with Options::fp8_weight_gradients (a fuzz repro of such a case) stores it in /options and
// in its content hash, and reads and regenerates with it (its weight gradients are the option's, not
// the default's); a case without it stores no such attribute and reads with the option off.
TEST_F(GoldenFile, Fp8WeightGradientsRoundTripAndAreStoredOnlyWhereSet) {
  CaseSpec spec = *find_case("fp8_smoke");
  const GoldenCase plain = make_case(spec);
  spec.options.fp8_weight_gradients = true;
  const GoldenCase fp8_grads = make_case(spec);
  write_golden(dir_ / "w.h5", fp8_grads);
  const GoldenCase back = read_golden(dir_ / "w.h5");
  EXPECT_TRUE(back.options.fp8_weight_gradients);
  expect_same_case(fp8_grads, back);
  expect_same_case(fp8_grads, regenerate(back));
  const auto d_w1 = [](const GoldenCase& g) {
    return std::ranges::find_if(g.results.outputs, [](const Tensor& t) { return t.name == "d_w1"; })->bytes;
  };
  EXPECT_NE(d_w1(fp8_grads), d_w1(plain)) << "the option changed no weight gradient";
  write_golden(dir_ / "p.h5", plain);
  EXPECT_FALSE(read_golden(dir_ / "p.h5").options.fp8_weight_gradients);
  RawGolden(dir_ / "w.h5").remove_attribute("/options", "fp8_weight_gradients");
  EXPECT_NE(read_error(dir_ / "w.h5").find("content_sha256 does not match"), std::string::npos);
}

// Stripped of its precision, an fp8 golden is refused, not read as a bf16 one (the attribute is in the
// content hash); so is an unknown precision.
TEST_F(GoldenFile, Fp8GoldenWithoutItsPrecisionIsRefused) {
  write_golden(dir_ / "p.h5", make_case(*find_case("fp8_smoke")));
  RawGolden(dir_ / "p.h5").remove_attribute("/config", "precision");
  EXPECT_NE(read_error(dir_ / "p.h5").find("content_sha256 does not match"), std::string::npos);
  try {
    precision_from_string("fp16");
    FAIL() << "an unknown precision was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mok: unknown precision 'fp16' (bf16 or fp8)");
  }
}

// A recipe routes as the inputs do: a golden whose recipe's routing kind contradicts its inputs (mok-golden check
// and mok-verify judged such a file apart) is neither written nor read.
TEST_F(GoldenFile, ARecipeContradictingTheInputsRoutingIsRefused) {
  // The message of the mok::Error that writing g throws ("" if it is written).
  const auto write_error = [&](const char* file, const GoldenCase& g) -> std::string {
    try {
      write_golden(dir_ / file, g);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ASSERT_FALSE(smoke_->routing_given());
  GoldenCase forged = *smoke_;
  forged.recipe->routing = ref::RoutingKind::zipf;
  EXPECT_EQ(write_error("forged.h5", forged),
            "mok: writing golden file " + (dir_ / "forged.h5").string() +
                ": group /recipe's routing_kind zipf contradicts the inputs, which hold none (/@routing_source "
                "router: the router routes)");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "forged.h5"));
  write_golden(dir_ / "edited.h5", *smoke_);
  {
    RawGolden raw(dir_ / "edited.h5");
    raw.set_string("/recipe", "routing_kind", "zipf");
  }
  EXPECT_NE(read_error(dir_ / "edited.h5").find("group /recipe's routing_kind zipf contradicts the inputs"),
            std::string::npos)
      << read_error(dir_ / "edited.h5");
  // The other way: inputs holding a given routing under a router's recipe.
  LayerConfig c = builtin_case().config;
  c.score_mode = ScoreMode::sigmoid;
  GoldenCase given = make_case("given", ref::make_problem(c, 77, ref::RoutingKind::one_hot), ref::Options{});
  ASSERT_TRUE(given.routing_given());
  given.recipe = Recipe{77, ref::RoutingKind::router_ties, 0.0};
  EXPECT_NE(write_error("given.h5", given)
                .find("routing_kind router_ties contradicts the inputs, which hold a given "
                      "routing (/@routing_source given)"),
            std::string::npos)
      << write_error("given.h5", given);
}

TEST_F(GoldenFile, GivenRoutingWithoutRecipeRoundTripsAndRegenerates) {
  LayerConfig c = builtin_case().config;
  c.score_mode = ScoreMode::sigmoid;
  const ref::Problem p = ref::make_problem(c, 77, ref::RoutingKind::one_hot);
  const GoldenCase g = make_case("explicit", p, ref::Options{});
  EXPECT_FALSE(g.recipe.has_value());
  EXPECT_TRUE(g.routing_given());
  EXPECT_EQ(g.find("logits"), nullptr);
  ASSERT_NE(g.find("expert_bias"), nullptr);
  write_golden(dir_ / "explicit.h5", g);
  const GoldenCase back = read_golden(dir_ / "explicit.h5");
  expect_same_case(g, back);
  expect_same_case(g, regenerate(back));
}

TEST_F(GoldenFile, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  write_golden(dir_ / "target.h5", *smoke_);
  const std::vector<char> old = testing::read_bytes(dir_ / "target.h5");
  GoldenCase bad = *smoke_;
  bad.results.outputs.back().bytes.pop_back();  // the last dataset written fails its size check
  try {
    write_golden(dir_ / "target.h5", bad);
    FAIL() << "a tensor of the wrong size was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/outputs/" + bad.results.outputs.back().name), std::string::npos) << e.what();
  }
  EXPECT_EQ(dir_.entries(), std::vector<std::string>{"target.h5"}) << "the temporary file was left behind";
  EXPECT_EQ(testing::read_bytes(dir_ / "target.h5"), old);
}

TEST_F(GoldenFile, WriteIntoMissingDirectoryFails) {
  try {
    write_golden(dir_ / "no-such-dir" / "x.h5", *smoke_);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dir_.entries().empty());
}

TEST_F(GoldenFile, RejectsAPlantedFault) {
  ref::Options faulty;
  faulty.fault = ref::Fault::combine_order;
  try {
    make_case("faulty", ref::make_problem(builtin_case().config, 1), faulty);
    FAIL() << "a golden was made with a planted fault";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a planted fault is set"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ShapeMustHoldTheValues) {
  EXPECT_THROW(make_tensor("t", {2, 3}, std::vector<float>(5)), Error);
  const Tensor t = make_tensor("t", {2, 2}, std::vector<int32_t>{1, -2, 3, 4});
  EXPECT_EQ(t.elements(), 4);
  EXPECT_EQ(int32_t(t.bits(1)), -2);
  EXPECT_THROW(f32_values(t), Error);
  EXPECT_EQ(i32_values(t), (std::vector<int32_t>{1, -2, 3, 4}));
}

TEST_F(GoldenFile, MissingFile) { EXPECT_NE(read_error(dir_ / "none.h5").find("no such file"), std::string::npos); }

// A directory, a FIFO (which would block a reader) or a device is named for what it is.
TEST_F(GoldenFile, NotARegularFile) {
  std::filesystem::create_directory(dir_ / "dir.h5");
  ASSERT_EQ(mkfifo((dir_ / "fifo.h5").c_str(), 0600), 0);
  EXPECT_NE(read_error(dir_ / "dir.h5").find("dir.h5: is a directory, not a regular file"), std::string::npos);
  EXPECT_NE(read_error(dir_ / "fifo.h5").find("fifo.h5: is a FIFO, not a regular file"), std::string::npos);
  EXPECT_NE(read_error("/dev/zero").find("/dev/zero: is a character device, not a regular file"), std::string::npos);
}

// A write replaces a regular file only: a FIFO or a symbolic link at the name is refused (as a device
// would be; not tried here: a regression would replace it) and left as it was, a link's target too;
// nothing is written beside it.
TEST_F(GoldenFile, WriteRefusesToReplaceWhatIsNotARegularFile) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.h5").c_str(), 0600), 0);
  write_golden(dir_ / "real.h5", *smoke_);
  const std::vector<char> real = testing::read_bytes(dir_ / "real.h5");
  std::filesystem::create_symlink(dir_ / "real.h5", dir_ / "link.h5");
  const auto write_error = [&](const std::filesystem::path& p) {
    try {
      write_golden(p, *smoke_);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(write_error(dir_ / "fifo.h5").find("fifo.h5: it is a FIFO, not a regular file"), std::string::npos);
  EXPECT_NE(write_error(dir_ / "link.h5").find("link.h5: it is a symbolic link"), std::string::npos);
  EXPECT_EQ(std::filesystem::symlink_status(dir_ / "fifo.h5").type(), std::filesystem::file_type::fifo);
  EXPECT_EQ(std::filesystem::symlink_status(dir_ / "link.h5").type(), std::filesystem::file_type::symlink);
  EXPECT_EQ(testing::read_bytes(dir_ / "real.h5"), real);
  std::vector<std::string> names = dir_.entries();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"fifo.h5", "link.h5", "real.h5"}));
}

// A name that could write escape codes or fake report lines to a terminal, or a ring_rows the layer
// refuses, is refused on writing (no file is made) and on reading (a file edited and sealed again).
TEST_F(GoldenFile, NamesAndRingRowsNoLayerCallHasAreRefused) {
  const auto write_error = [&](const GoldenCase& g) {
    try {
      write_golden(dir_ / "w.h5", g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GoldenCase named = *smoke_, ringless = *smoke_;
  named.name = "smoke\nEQUAL  all bitwise equal";
  ringless.options.ring_rows = 0;
  EXPECT_NE(write_error(named).find("name 'smoke\\x0aEQUAL  all bitwise equal' is no case name"), std::string::npos)
      << write_error(named);
  EXPECT_NE(write_error(ringless).find("ring_rows = 0 is not a positive multiple of 16"), std::string::npos)
      << write_error(ringless);
  EXPECT_TRUE(dir_.entries().empty());
  write_golden(dir_ / "n.h5", *smoke_);
  write_golden(dir_ / "r.h5", *smoke_);
  RawGolden(dir_ / "n.h5").set_root_string("name", "smoke\x1b[2J");
  RawGolden(dir_ / "r.h5").set_i32("/options", "ring_rows", 0);
  EXPECT_NE(read_error(dir_ / "n.h5").find("attribute /@name 'smoke\\x1b[2J' is no case name"), std::string::npos)
      << read_error(dir_ / "n.h5");
  EXPECT_NE(read_error(dir_ / "r.h5").find("attribute /options@ring_rows = 0 is not a positive multiple of 16"),
            std::string::npos)
      << read_error(dir_ / "r.h5");
}

// Killed by any signal that ends a process by default (SIGHUP of a closed terminal, SIGTERM, SIGINT,
// ...) in the middle of a write (here: right after the temporary is written), the process removes the
// hidden temporary before it dies, and the target is left as it was.
TEST_F(GoldenFile, ASignalDuringAWriteLeavesNoTemporary) {
  for (const int sig : kTerminatingSignals) {
    SCOPED_TRACE(strsignal(sig));
    struct sigaction now {};
    if (sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;  // ignored (nohup): kept so
    write_golden(dir_ / "target.h5", *smoke_);
    const std::vector<char> old = testing::read_bytes(dir_ / "target.h5");
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const rlimit no_core{0, 0};  // SIGQUIT's default action dumps core
      setrlimit(RLIMIT_CORE, &no_core);
      AtomicFile file(dir_ / "target.h5");
      testing::write_bytes(file.temp_path(), {'p', 'a', 'r', 't'});
      raise(sig);
      _exit(0);  // not reached: the signal's default action ends the process
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_EQ(dir_.entries(), std::vector<std::string>{"target.h5"}) << "the temporary was left behind";
    EXPECT_EQ(testing::read_bytes(dir_ / "target.h5"), old);
  }
}

// A file written again keeps its permissions: a private (0600) golden became 0644, the temporary's.
TEST_F(GoldenFile, AFileWrittenAgainKeepsItsPermissions) {
  write_golden(dir_ / "private.h5", *smoke_);
  std::filesystem::permissions(dir_ / "private.h5",
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  write_golden(dir_ / "private.h5", *smoke_);
  EXPECT_EQ(std::filesystem::status(dir_ / "private.h5").permissions(),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// A write past the file-size limit (`ulimit -f`) is SIGXFSZ, which ends the process: it left the hidden
// temporary, cut at the limit, beside the target.
TEST_F(GoldenFile, AWritePastTheFileSizeLimitLeavesNoTemporary) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit no_core{0, 0}, small{4096, 4096};
    setrlimit(RLIMIT_CORE, &no_core);
    setrlimit(RLIMIT_FSIZE, &small);
    write_golden(dir_ / "big.h5", *smoke_);
    _exit(0);  // not reached: the golden is larger than the limit
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << "status " << status;
  EXPECT_EQ(dir_.entries(), std::vector<std::string>{}) << "the temporary was left behind";
}

// A name of NAME_MAX bytes, which the system takes, failed once the golden was written: its temporary
// ".<name>.tmp.<pid>.<n>" was longer than NAME_MAX ("File name too long").
TEST_F(GoldenFile, ANameOfTheLongestLengthIsWritten) {
  const std::filesystem::path target = dir_ / (std::string(NAME_MAX - 3, 'g') + ".h5");
  write_golden(target, *smoke_);
  EXPECT_EQ(read_golden(target).name, smoke_->name);
  EXPECT_EQ(dir_.entries(), std::vector<std::string>{target.filename().string()});
}

TEST_F(GoldenFile, NotAGolden) {
  testing::write_bytes(dir_ / "text.h5", {'h', 'e', 'l', 'l', 'o'});
  EXPECT_NE(read_error(dir_ / "text.h5").find("not a mok golden file"), std::string::npos);
  testing::h5(H5Fclose(testing::h5(H5Fcreate((dir_ / "plain.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                   "H5Fcreate plain.h5")),
              "H5Fclose plain.h5");
  EXPECT_NE(read_error(dir_ / "plain.h5").find("an HDF5 file, but no mok golden"), std::string::npos);
}

TEST_F(GoldenFile, Truncated) {
  write_golden(dir_ / "t.h5", *smoke_);
  std::vector<char> bytes = testing::read_bytes(dir_ / "t.h5");
  bytes.resize(bytes.size() / 2);
  testing::write_bytes(dir_ / "t.h5", bytes);
  const std::string error = read_error(dir_ / "t.h5");
  EXPECT_NE(error.find("truncated: " + std::to_string(bytes.size()) + " bytes, the seal says"), std::string::npos)
      << error;
  EXPECT_NE(error.find("t.h5"), std::string::npos) << error;
}

TEST_F(GoldenFile, WrongFormatVersion) {
  write_golden(dir_ / "v.h5", *smoke_);
  RawGolden(dir_ / "v.h5").set_root_i32("format_version", 2);
  EXPECT_NE(read_error(dir_ / "v.h5").find("format version 2, this build reads version 1"), std::string::npos);
}

// The seal's version is named before the rest of the seal is parsed: a golden of another format version,
// whose seal may say more or other things, was reported as "the seal block is damaged: the file is corrupt".
// A negative size is damage, not a size of 2^64 - 5.
TEST_F(GoldenFile, SealOfAnotherVersionIsNamedAndASignedSizeIsDamage) {
  write_golden(dir_ / "s.h5", *smoke_);
  const std::vector<char> original = testing::read_bytes(dir_ / "s.h5");
  const auto with_seal = [&](const std::string& seal) {
    std::vector<char> bytes = original;
    std::fill(bytes.begin(), bytes.begin() + kSealBytes, '\0');
    std::copy(seal.begin(), seal.end(), bytes.begin());
    testing::write_bytes(dir_ / "s.h5", bytes);
    return read_error(dir_ / "s.h5");
  };
  const std::string sha(64, 'a');
  for (const std::string& seal :
       {std::string("mok-golden 2\nsize 7\nblake3 " + sha + "\n"), std::string("mok-golden 2\n")}) {
    const std::string error = with_seal(seal);
    EXPECT_NE(error.find("format version 2, this build reads version 1"), std::string::npos) << error;
  }
  const std::string error = with_seal("mok-golden 1\nsize -5\nsha256 " + sha + "\n");
  EXPECT_NE(error.find("the seal block is damaged"), std::string::npos) << error;
}

// The seal block is the one the writer writes, byte for byte: a byte changed in its NUL padding (or a
// space doubled in its text) was read as an intact seal, EQUAL, exit 0.
TEST_F(GoldenFile, ABlockChangedInItsPaddingIsDamage) {
  write_golden(dir_ / "p.h5", *smoke_);
  const std::vector<char> original = testing::read_bytes(dir_ / "p.h5");
  for (const size_t at : {size_t(kSealBytes - 1), size_t(300)}) {
    std::vector<char> bytes = original;
    ASSERT_EQ(bytes[at], '\0');
    bytes[at] = 1;
    testing::write_bytes(dir_ / "p.h5", bytes);
    const std::string error = read_error(dir_ / "p.h5");
    EXPECT_NE(error.find("the seal block is damaged"), std::string::npos) << at << ": " << error;
  }
  std::vector<char> bytes = original;
  const std::string text(bytes.begin(), bytes.begin() + kSealBytes);
  const size_t space = text.find("size ") + 4;
  bytes.insert(bytes.begin() + long(space), ' ');  // "size  N": the same fields, another text
  bytes.erase(bytes.begin() + long(text.find('\0')) + 1);
  testing::write_bytes(dir_ / "p.h5", bytes);
  EXPECT_NE(read_error(dir_ / "p.h5").find("the seal block is damaged"), std::string::npos);
}

TEST_F(GoldenFile, WrongNumericsVersion) {
  write_golden(dir_ / "n.h5", *smoke_);
  RawGolden(dir_ / "n.h5").set_root_i32("numerics_model_version", kNumericsModelVersion + 1);
  EXPECT_NE(read_error(dir_ / "n.h5").find("numerics model version"), std::string::npos);
}

TEST_F(GoldenFile, MissingDataset) {
  write_golden(dir_ / "m.h5", *smoke_);
  RawGolden(dir_ / "m.h5").remove("/outputs/d_w2");
  EXPECT_NE(read_error(dir_ / "m.h5").find("missing dataset /outputs/d_w2"), std::string::npos);
}

TEST_F(GoldenFile, WrongElementType) {
  write_golden(dir_ / "d.h5", *smoke_);
  RawGolden(dir_ / "d.h5").retype_as_f32("/inputs/x");
  EXPECT_NE(read_error(dir_ / "d.h5").find("dataset /inputs/x has the wrong element type"), std::string::npos);
}

TEST_F(GoldenFile, EditedDataFailsItsHash) {
  write_golden(dir_ / "e.h5", *smoke_);
  RawGolden(dir_ / "e.h5").flip_bit("/outputs/y", 10, 0);
  const std::string error = read_error(dir_ / "e.h5");
  EXPECT_NE(error.find("dataset /outputs/y: SHA-256 mismatch"), std::string::npos) << error;
}

// The stored digest is quoted with its bytes escaped: a message of raw bytes is no valid UTF-8 for a
// caller (Python's decoding of it hid the error behind a UnicodeDecodeError).
TEST_F(GoldenFile, ABadStoredDigestIsQuotedEscaped) {
  write_golden(dir_ / "q.h5", *smoke_);
  RawGolden(dir_ / "q.h5").set_string("/outputs/y", "sha256", "\xc9\x01 not hex");
  const std::string error = read_error(dir_ / "q.h5");
  EXPECT_NE(error.find("dataset /outputs/y: SHA-256 mismatch, stored '\\xc9\\x01 not hex'"), std::string::npos)
      << error;
}

// The tests' own HDF5 edits are checked: one that cannot land throws, naming the call and the object,
// instead of leaving the file as it was (a test of a bad file would then read a good one).
TEST_F(GoldenFile, RawEditsThatCannotLandThrow) {
  write_golden(dir_ / "x.h5", *smoke_);
  const auto edit_error = [&](const std::function<void(RawGolden&)>& edit) -> std::string {
    try {
      RawGolden raw(dir_ / "x.h5");
      edit(raw);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(edit_error([](RawGolden& raw) { raw.flip_bit("/outputs/nosuch", 0, 0); }),
            "HDF5 failed: H5Dopen2 /outputs/nosuch");
  EXPECT_EQ(edit_error([](RawGolden& raw) { raw.retype_as_f32("/inputs/nosuch"); }),
            "HDF5 failed: H5Dopen2 /inputs/nosuch");
  EXPECT_EQ(edit_error([](RawGolden& raw) { raw.set_i32("/nosuch", "ring_rows", 1); }),
            "no attribute /nosuch@ring_rows");
  EXPECT_EQ(read_error(dir_ / "x.h5"), "") << "a refused edit changed the file";
}

TEST_F(GoldenFile, EditedAttributeFailsTheContentHash) {
  write_golden(dir_ / "a.h5", *smoke_);
  RawGolden(dir_ / "a.h5").set_root_string("description", "edited by hand");
  EXPECT_NE(read_error(dir_ / "a.h5").find("content_sha256 does not match"), std::string::npos);
}

// A stored oracle accuracy that no oracle gives (a negative error; a bound not positive and finite) is
// the file's error, named: it was read, and mok-verify printed "-1 + 0 <= 0.0312 yes". An infinite or NaN
// error (an overflowed sum, an all-zero scale) reads: it fails every bound.
TEST_F(GoldenFile, OracleAccuracyNoOracleGivesIsRefused) {
  const struct {
    double rel_error, bound;
    std::string message;  // "" reads
  } cases[] = {{-1.0, 0.03125, "/outputs/d_logits@oracle_rel_error = -1.000000 is negative"},
               {0.002, std::nan(""), "/outputs/d_logits@oracle_rel_bound = nan is not positive and finite"},
               {0.002, 0.0, "/outputs/d_logits@oracle_rel_bound = 0.000000 is not positive and finite"},
               {0.002, -0.5, "@oracle_rel_bound = -0.500000 is not positive and finite"},
               {0.002, HUGE_VAL, "@oracle_rel_bound = inf is not positive and finite"},
               {HUGE_VAL, 0.03125, ""},
               {std::nan(""), 0.03125, ""}};
  for (const auto& c : cases) {
    GoldenCase g = *smoke_;
    ASSERT_EQ(g.oracle.count("d_logits"), 1u);
    g.oracle["d_logits"] = OracleAccuracy{c.rel_error, c.bound};
    write_golden(dir_ / "o.h5", g);
    const std::string error = read_error(dir_ / "o.h5");
    if (c.message.empty())
      EXPECT_EQ(error, "") << c.rel_error;
    else
      EXPECT_NE(error.find(c.message), std::string::npos) << c.message << "\n" << error;
  }
}

TEST_F(GoldenFile, FlippedByteFailsTheSeal) {
  write_golden(dir_ / "c.h5", *smoke_);
  std::vector<char> bytes = testing::read_bytes(dir_ / "c.h5");
  bytes[bytes.size() / 2] ^= 0x04;
  testing::write_bytes(dir_ / "c.h5", bytes);
  EXPECT_NE(read_error(dir_ / "c.h5").find("does not match its seal: the file is corrupt"), std::string::npos);
}

TEST_F(GoldenFile, EveryFlippedByteIsCaughtOrHarmless) {
  const GoldenCase small = make_case(*find_case("single_token"));
  write_golden(dir_ / "s.h5", small);
  const std::vector<char> bytes = testing::read_bytes(dir_ / "s.h5");
  const size_t stride = std::max<size_t>(1, bytes.size() / 250);
  int caught = 0, harmless = 0;
  for (size_t at = 0; at < bytes.size(); at += stride) {
    std::vector<char> flipped = bytes;
    flipped[at] = char(flipped[at] ^ 0x20);
    testing::write_bytes(dir_ / "f.h5", flipped);
    try {
      const GoldenCase back = read_golden(dir_ / "f.h5");
      expect_same_case(small, back);
      ++harmless;
    } catch (const Error&) {
      ++caught;
    }
    if (::testing::Test::HasFailure()) FAIL() << "a flip at byte " << at << " changed what the file says unnoticed";
  }
  EXPECT_GT(caught, 0);
  std::cout << caught << " flips caught, " << harmless << " in bytes that carry nothing\n";
}

}  // namespace
}  // namespace mok::golden
