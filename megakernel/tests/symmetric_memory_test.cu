// symmetric_memory (peer_group.cu) on NCCL's answers, without a GPU: this test defines the NCCL entry points
// it calls (ncclDevCommCreate, ncclDevCommDestroy, ncclGroupStart, ncclGroupEnd, ncclGetLastError), which
// the linker binds in place of libnccl's, and scripts their results. NCCL's refusal of symmetric memory
// (ncclInvalidUsage, as src/dev_runtime.cc of 2.28 refuses) is "unavailable" with NCCL's reason; any other
// failure, of a communicator's creation or of the group's end, throws NCCL's message: both were read as "no
// symmetric memory", the reason lost. ctest label core (no GPU, no NCCL runtime needed).
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device.h>

#include <string>
#include <vector>

#include "mok/megakernel/nccl.h"

namespace {

// What the fake NCCL answers, and what it was asked.
struct FakeNccl {
  std::vector<ncclResult_t> create_results;  // ncclDevCommCreate's, call by call (then ncclSuccess)
  std::vector<int> lsa_sizes;                // each made device communicator's LSA team, call by call
  ncclResult_t end_result = ncclSuccess;     // ncclGroupEnd's when no call in the group failed
  std::string last_warning;                  // ncclGetLastError's
  int creates = 0, destroys = 0, group_depth = 0;
  ncclResult_t group_error = ncclSuccess;  // a call's failure inside the group, which ncclGroupEnd returns
};
FakeNccl fake;

}  // namespace

extern "C" ncclResult_t ncclGroupStart() {
  ++fake.group_depth;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupEnd() {
  --fake.group_depth;
  const ncclResult_t result = fake.group_error != ncclSuccess ? fake.group_error : fake.end_result;
  fake.group_error = ncclSuccess;
  return result;
}

extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t* out) {
  const size_t call = size_t(fake.creates++);
  const ncclResult_t result = call < fake.create_results.size() ? fake.create_results[call] : ncclSuccess;
  if (result != ncclSuccess) {
    fake.group_error = result;
    return result;
  }
  out->lsaSize = call < fake.lsa_sizes.size() ? fake.lsa_sizes[call] : 1;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*) {
  ++fake.destroys;
  return ncclSuccess;
}

extern "C" const char* ncclGetLastError(ncclComm_t) { return fake.last_warning.c_str(); }

namespace mok::gpu {
namespace {

constexpr const char* kNoSymmetricSupport = "Communicator does not support symmetric memory!";

// Two communicators the fake never reads (symmetric_memory only hands them back to NCCL).
std::vector<ncclComm_t> two_comms() {
  static int comms[2];
  return {reinterpret_cast<ncclComm_t>(&comms[0]), reinterpret_cast<ncclComm_t>(&comms[1])};
}

// The message symmetric_memory throws for the fake's script (the test fails where it throws none).
std::string thrown_message() {
  try {
    symmetric_memory(two_comms());
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "symmetric_memory threw no mok::Error";
  return "";
}

class SymmetricMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = FakeNccl{}; }
  void TearDown() override { EXPECT_EQ(fake.group_depth, 0) << "a group left open"; }
};

TEST_F(SymmetricMemoryTest, EveryCommunicatorMadeGivesTheFewestLoadStoreRanks) {
  fake.lsa_sizes = {2, 1};
  const SymmetricMemory memory = symmetric_memory(two_comms());
  EXPECT_TRUE(memory.available);
  EXPECT_EQ(memory.load_store_ranks, 1);
  EXPECT_EQ(memory.refusal, "");
  EXPECT_EQ(fake.destroys, 2);  // the probe's device communicators are destroyed again
}

// NCCL's refusal is an answer, not an error: one GPU runs on without symmetric memory (NCCL < 2.28.7), and
// several name NCCL's reason (PeerGroup::open_nccl).
TEST_F(SymmetricMemoryTest, NcclsRefusalIsUnavailableWithNcclsReason) {
  fake.create_results = {ncclInvalidUsage};
  fake.last_warning = kNoSymmetricSupport;
  const SymmetricMemory memory = symmetric_memory(two_comms());
  EXPECT_FALSE(memory.available);
  EXPECT_EQ(memory.load_store_ranks, 0);
  EXPECT_NE(memory.refusal.find("NCCL error (ncclDevCommCreate): "), std::string::npos) << memory.refusal;
  EXPECT_NE(memory.refusal.find(ncclGetErrorString(ncclInvalidUsage)), std::string::npos) << memory.refusal;
  EXPECT_NE(memory.refusal.find(kNoSymmetricSupport), std::string::npos) << memory.refusal;
  EXPECT_EQ(fake.destroys, 0);  // nothing was made
}

// A communicator's creation failing for another reason (out of memory, say) was read as "no symmetric
// memory": one GPU ran on without it, several were told NCCL gave none, NCCL's reason lost.
TEST_F(SymmetricMemoryTest, AFailedCreationThrowsNcclsMessage) {
  fake.create_results = {ncclSuccess, ncclUnhandledCudaError};
  fake.last_warning = "Cuda failure 2 'out of memory'";
  const std::string message = thrown_message();
  EXPECT_NE(message.find("NCCL error (ncclDevCommCreate): "), std::string::npos) << message;
  EXPECT_NE(message.find(ncclGetErrorString(ncclUnhandledCudaError)), std::string::npos) << message;
  EXPECT_NE(message.find("Cuda failure 2 'out of memory'"), std::string::npos) << message;
}

// The device communicators are made at the group's end: its failure is a real one too.
TEST_F(SymmetricMemoryTest, AFailedGroupEndThrowsNcclsMessage) {
  fake.end_result = ncclSystemError;
  fake.last_warning = "Failed to map symmetric memory";
  const std::string message = thrown_message();
  EXPECT_NE(message.find("NCCL error (ncclGroupEnd after ncclDevCommCreate): "), std::string::npos) << message;
  EXPECT_NE(message.find(ncclGetErrorString(ncclSystemError)), std::string::npos) << message;
  EXPECT_NE(message.find("Failed to map symmetric memory"), std::string::npos) << message;
}

// Every checked NCCL call's error carries NCCL's last warning, where the result's string alone says only
// "invalid usage"; without a warning, the string alone.
TEST_F(SymmetricMemoryTest, CheckedCallsCarryNcclsLastWarning) {
  fake.last_warning = "Invalid config blocking attribute value -1";
  try {
    MOK_NCCL_CHECK(ncclInvalidArgument);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), std::string("mok: NCCL error (ncclInvalidArgument): ") +
                                         ncclGetErrorString(ncclInvalidArgument) +
                                         "; NCCL's last warning: Invalid config blocking attribute value -1");
  }
  fake.last_warning.clear();
  EXPECT_EQ(nccl_error(ncclInternalError, "ncclCommCount"),
            std::string("NCCL error (ncclCommCount): ") + ncclGetErrorString(ncclInternalError));
}

}  // namespace
}  // namespace mok::gpu
