// The catalogue covers issue 3's list; case files parse or fail naming the line; one global batch
// gives the same bits over R = 1, 2, 4, 8, ring capacities and recompute mode (docs/design.md, D2).
#include "mok/golden/catalogue.h"

#include <gtest/gtest.h>

#include <set>

#include "mok/golden/locate.h"

namespace mok::golden {
namespace {

TEST(Catalogue, NamesAreUniqueAndConfigsValid) {
  std::set<std::string> names;
  for (const CaseSpec& s : catalogue()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_NO_THROW(validate(s.config)) << s.name;
    EXPECT_FALSE(s.description.empty()) << s.name;
  }
  EXPECT_EQ(find_case(builtin_case().name), &builtin_case());
  EXPECT_EQ(find_case("no such case"), nullptr);
}

TEST(Catalogue, CoversTheIssueList) {
  std::set<int> ranks;
  bool softmax = false, sigmoid = false, shared = false, unshared = false, clamped = false, zipf = false;
  bool all_to_one = false, sparse = false, ties = false, single_token = false, recompute = false, fp8 = false;
  for (const CaseSpec& s : catalogue()) {
    const LayerConfig& c = s.config;
    ranks.insert(c.ranks);
    softmax |= c.score_mode == ScoreMode::softmax;
    sigmoid |= c.score_mode == ScoreMode::sigmoid;
    shared |= c.has_shared();
    unshared |= !c.has_shared();
    clamped |= c.swiglu_limit > 0.0f;
    zipf |= s.recipe.routing == ref::RoutingKind::zipf;
    all_to_one |= s.recipe.routing == ref::RoutingKind::all_to_one && c.top_k == 1;
    sparse |= s.recipe.routing == ref::RoutingKind::sparse;
    ties |= s.recipe.routing == ref::RoutingKind::router_ties;
    single_token |= c.tokens_per_rank == 1;
    recompute |= s.options.recompute;
    fp8 |= c.precision == Precision::fp8;
  }
  EXPECT_EQ(ranks, (std::set<int>{1, 2, 4, 8}));
  EXPECT_TRUE(softmax && sigmoid && shared && unshared && clamped && zipf && all_to_one && sparse && ties &&
              single_token && recompute && fp8);
  EXPECT_NE(find_case("medium"), nullptr);
}

TEST(Catalogue, OneGlobalBatchGivesTheSameBitsOverRanksRingsAndRecompute) {
  const Recipe recipe{11};
  const struct {
    int ranks, ring_rows;
    bool recompute;
  } runs[] = {{1, 256, false}, {2, 16, false}, {4, 32, true}, {8, 48, false}};
  std::optional<LayerResults> first;
  for (const auto& r : runs) {
    LayerConfig c;
    c.ranks = r.ranks;
    c.tokens_per_rank = 64 / r.ranks;
    c.experts = 8;
    c.top_k = 2;
    c.shared_intermediate = 64;
    ref::Options o;
    o.ring_rows = r.ring_rows;
    o.recompute = r.recompute;
    const LayerResults results = run_reference(ref::make_problem(c, recipe.seed), o);
    if (!first) {
      first = results;
      continue;
    }
    std::vector<Tensor> want = first->routing, got = results.routing;
    want.insert(want.end(), first->outputs.begin(), first->outputs.end());
    got.insert(got.end(), results.outputs.begin(), results.outputs.end());
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const std::optional<int64_t> diff = first_difference(want[i], got[i]);
      EXPECT_FALSE(diff) << "R=" << r.ranks << ": " << element_name(want[i], diff.value_or(0));
    }
  }
}

TEST(CaseFile, ExampleParsesWithEveryKey) {
  const CaseSpec s = parse_case_file(MOK_EXAMPLE_CASE_FILE);
  EXPECT_EQ(s.name, "example_deepseek_like");
  EXPECT_EQ(s.config.ranks, 2);
  EXPECT_EQ(s.config.tokens_per_rank, 20);
  EXPECT_EQ(s.config.experts, 8);
  EXPECT_EQ(s.config.top_k, 4);
  EXPECT_EQ(s.config.score_mode, ScoreMode::sigmoid);
  EXPECT_EQ(s.config.n_group, 4);
  EXPECT_EQ(s.config.topk_group, 2);
  EXPECT_EQ(s.config.routed_scale, 2.5f);
  EXPECT_EQ(s.config.swiglu_limit, 7.0f);
  EXPECT_EQ(s.config.shared_intermediate, 64);
  EXPECT_EQ(s.config.precision, Precision::bf16);
  EXPECT_EQ(s.options.step, StepModel::hopper_tc);
  EXPECT_EQ(s.options.ring_rows, 32);
  EXPECT_FALSE(s.options.recompute);
  EXPECT_EQ(s.recipe.seed, 2024u);
  EXPECT_EQ(s.recipe.routing, ref::RoutingKind::router);
}

TEST(CaseFile, Fp8NeedsItsBlockMultiples) {
  const CaseSpec s = parse_case_text("precision = fp8\nhidden = 128\nintermediate = 256\n", "mem", "fp8");
  EXPECT_EQ(s.config.precision, Precision::fp8);
  try {
    parse_case_text("precision = fp8\n", "mem", "fp8");  // H = I = 64
    FAIL() << "fp8 with H = 64 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mok: mem: invalid input: hidden H = 64 is not a multiple of 128"),
              std::string::npos)
        << e.what();
  }
  try {
    parse_case_text("precision = fp4\n", "mem", "fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mem:1: unknown precision 'fp4'"), std::string::npos) << e.what();
  }
}

TEST(CaseFile, DefaultsAndName) {
  const CaseSpec s = parse_case_text("# only a comment\n\nexperts = 4 # trailing comment\n", "mem", "fallback");
  EXPECT_EQ(s.name, "fallback");
  EXPECT_EQ(s.config.experts, 4);
  EXPECT_EQ(s.config.ranks, 1);
  EXPECT_EQ(s.options.ring_rows, 256);
}

std::string parse_error(const std::string& text) {
  try {
    parse_case_text(text, "case.txt", "c");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CaseFile, ErrorsNameTheLine) {
  EXPECT_EQ(parse_error("experts = 4\ncolour = red\n"),
            "mok: case.txt:2: unknown key 'colour' (the keys are listed in "
            "docs/golden-format.md)");
  EXPECT_EQ(parse_error("experts = 4\nexperts = 8\n"), "mok: case.txt:2: key experts repeats line 1");
  EXPECT_EQ(parse_error("top_k = two\n"), "mok: case.txt:1: top_k = 'two': expected an integer");
  EXPECT_EQ(parse_error("recompute = yes\n"), "mok: case.txt:1: recompute = 'yes': expected true or false");
  EXPECT_EQ(parse_error("just words\n"), "mok: case.txt:1: expected key = value, got 'just words'");
  EXPECT_EQ(parse_error("routing = sideways\n"),
            "mok: case.txt:1: unknown routing kind 'sideways' (router, router_ties, uniform, zipf, one_hot, "
            "all_to_one or sparse)");
  EXPECT_NE(
      parse_error("ranks = 3\nexperts = 4\n").find("mok: case.txt: invalid input: experts E = 4 is not a multiple"),
      std::string::npos);
}

// Issue 16: values that parsed and then meant something else (a NaN scale, a limit that rounds to 0,
// an exponent no Zipf law has), sizes past int32 or memory: each refused, naming the line or the file.
TEST(CaseFile, ValuesAFloatOrAZipfLawCannotHoldAreRefused) {
  for (const char* scale : {"nan", "-3", "0", "1e-50", "1e39"})
    for (const char* mode : {"softmax", "sigmoid"}) {
      const std::string message = parse_error(std::string("score_mode = ") + mode + "\nrouted_scale = " + scale + "\n");
      EXPECT_NE(message.find("mok: case.txt"), std::string::npos) << message;
      EXPECT_NE(message.find("routed_scale"), std::string::npos) << mode << " " << scale << ": " << message;
    }
  EXPECT_EQ(parse_error("swiglu_limit = 1e-50\n"),
            "mok: case.txt:1: swiglu_limit = '1e-50': expected a float32 value, but it rounds to 0 or to a "
            "subnormal in float32");
  EXPECT_NE(parse_error("swiglu_limit = 1e-40\n").find("rounds to 0 or to a subnormal"), std::string::npos);
  EXPECT_EQ(parse_error("routed_scale = 1e39\n"),
            "mok: case.txt:1: routed_scale = '1e39': expected a float32 value, but it is out of the float32 range");
  EXPECT_EQ(parse_error("zipf_s = nan\n"),
            "mok: case.txt:1: invalid input: zipf_s = nan (need a finite Zipf exponent >= 0)");
  EXPECT_EQ(parse_error("zipf_s = -1e308\n"),
            "mok: case.txt:1: invalid input: zipf_s = -1e+308 (need a finite Zipf exponent >= 0)");
  EXPECT_EQ(parse_error("zipf_s = 1e999\n"), "mok: case.txt:1: zipf_s = '1e999': expected a number");
}

// A case's name names its golden, NAME.h5: a path separator or ".." in it, or more than
// kMaxCaseNameBytes, is refused (a name of any length was taken), as on reading a golden.
TEST(CaseFile, NamesThatNameNoFileOfTheirOwnAreRefused) {
  const std::string no_file = "' is no case name: it names a file, so no '/', '\\' or '..'";
  EXPECT_EQ(parse_error("name = ../x\n"), "mok: case.txt: name '../x" + no_file);
  EXPECT_EQ(parse_error("name = a/b\n"), "mok: case.txt: name 'a/b" + no_file);
  EXPECT_EQ(parse_error("name = a\\b\n"), "mok: case.txt: name 'a\\\\b" + no_file);
  EXPECT_EQ(parse_error("name = a..b\n"), "mok: case.txt: name 'a..b" + no_file);
  const std::string longest(kMaxCaseNameBytes, 'n');
  EXPECT_EQ(parse_case_text("name = " + longest + "\n", "case.txt", "c").name, longest);
  EXPECT_EQ(parse_error("name = " + longest + "n\n"),
            "mok: case.txt: name '" + std::string(32, 'n') + "'... of 129 bytes is no case name: at most 128 bytes");
}

TEST(CaseFile, NumbersParseStrictly) {
  for (const char* line : {"seed = -1", "seed = +1", "ranks = 2x", "ranks = 0x2", "zipf_s = 1.5.", "zipf_s = +1"})
    EXPECT_NE(parse_error(std::string(line) + "\n").find("expected"), std::string::npos) << line;
}

TEST(CaseFile, SizesPastInt32OrMemoryAreRefused) {
  EXPECT_EQ(parse_error("ranks = 2\ntokens_per_rank = 1073741824\nexperts = 2\n"),
            "mok: case.txt: invalid input: tokens N = R * T = 2147483648 is more than 2^31 - 1: too large for mok's "
            "32-bit indices");
  EXPECT_NE(parse_error("hidden = 1073741824\nintermediate = 1073741824\n").find("2 * I = 2147483648"),
            std::string::npos);
  const std::string memory = parse_error("hidden = 1048576\nintermediate = 1048576\n");
  EXPECT_NE(memory.find("mok: case.txt: invalid input: this problem"), std::string::npos) << memory;
  EXPECT_NE(memory.find("GiB of host memory here (5 times its tensors'"), std::string::npos) << memory;
}

// An HDF5 string ends at a NUL byte: the description is refused naming its line, before the case is computed (it
// was refused only when the file was written).
TEST(CaseFile, ANulByteInTheDescriptionIsRefusedNamingTheLine) {
  const std::string message = parse_error(std::string("experts = 4\ndescription = a\0b\n", 30));
  EXPECT_NE(message.find("mok: case.txt:2: description = "), std::string::npos) << message;
  EXPECT_NE(message.find("expected text without a NUL byte"), std::string::npos) << message;
}

TEST(CaseFile, BinaryJunkIsEchoedEscaped) {
  const std::string message = parse_error("col\x1b[31mour = red\n");
  EXPECT_EQ(message, "mok: case.txt:1: unknown key 'col\\x1b[31mour' (the keys are listed in docs/golden-format.md)");
  EXPECT_EQ(parse_error("\x01\x02\n"), "mok: case.txt:1: expected key = value, got '\\x01\\x02'");
  EXPECT_EQ(parse_error("top_k = \x80\n"), "mok: case.txt:1: top_k = '\\x80': expected an integer");
}

}  // namespace
}  // namespace mok::golden
