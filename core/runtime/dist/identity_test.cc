// identity_test — identity_from_vars for each launcher (env/torchrun, Open MPI, Slurm, none), Slurm node lists and
// task counts, and the errors: non-integers, a rank outside the world, a missing partner variable or port.
#include "core/runtime/dist/identity.h"

#include <gtest/gtest.h>

namespace keel::dist {
namespace {

TEST(Identity, NothingSetIsOneProcess) {
  auto id = identity_from_vars({});
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id->rank, 0);
  EXPECT_EQ(id->world_size, 1);
  EXPECT_EQ(id->local_rank, 0);
  EXPECT_EQ(id->local_world_size, 1);
  EXPECT_EQ(id->master_addr, "127.0.0.1");
  EXPECT_EQ(id->source, IdentitySource::kSingle);
}

TEST(Identity, TorchrunStyle) {
  auto id = identity_from_vars({{"RANK", "5"},
                                {"WORLD_SIZE", "8"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "4"},
                                {"MASTER_ADDR", "node0"},
                                {"MASTER_PORT", "29501"}});
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id->rank, 5);
  EXPECT_EQ(id->world_size, 8);
  EXPECT_EQ(id->local_rank, 1);
  EXPECT_EQ(id->local_world_size, 4);
  EXPECT_EQ(id->master_addr, "node0");
  EXPECT_EQ(id->master_port, 29501);
  EXPECT_EQ(id->source, IdentitySource::kEnv);
  EXPECT_EQ(id->to_string(), "rank 5 of 8 (local 1 of 4), master node0:29501, from env (RANK/WORLD_SIZE)");
  // Without LOCAL_*: one node.
  auto one = identity_from_vars({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  EXPECT_EQ(one->local_rank, 2);
  EXPECT_EQ(one->local_world_size, 3);
  EXPECT_EQ(one->master_addr, "127.0.0.1");
  // The env style wins over Open MPI's.
  auto both = identity_from_vars(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  ASSERT_TRUE(both.is_ok());
  EXPECT_EQ(both->source, IdentitySource::kEnv);
}

TEST(Identity, OpenMpi) {
  auto id = identity_from_vars({{"OMPI_COMM_WORLD_RANK", "3"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id->rank, 3);
  EXPECT_EQ(id->world_size, 4);
  EXPECT_EQ(id->local_rank, 1);
  EXPECT_EQ(id->local_world_size, 2);
  EXPECT_EQ(id->master_addr, "127.0.0.1");
  EXPECT_EQ(id->master_port, 29500);
  EXPECT_EQ(id->source, IdentitySource::kOpenMpi);
  auto with_master = identity_from_vars({{"OMPI_COMM_WORLD_RANK", "0"},
                                         {"OMPI_COMM_WORLD_SIZE", "2"},
                                         {"MASTER_ADDR", "10.0.0.1"},
                                         {"MASTER_PORT", "4000"}});
  ASSERT_TRUE(with_master.is_ok());
  EXPECT_EQ(with_master->master_addr, "10.0.0.1");
  EXPECT_EQ(with_master->master_port, 4000);
}

TEST(Identity, Slurm) {
  auto id = identity_from_vars({{"SLURM_PROCID", "5"},
                                {"SLURM_NTASKS", "7"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NODEID", "2"},
                                {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                {"SLURM_JOB_NODELIST", "gpu[07-09,12]"},
                                {"SLURM_JOB_ID", "123456"}});
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id->rank, 5);
  EXPECT_EQ(id->world_size, 7);
  EXPECT_EQ(id->local_rank, 1);
  EXPECT_EQ(id->local_world_size, 2);
  EXPECT_EQ(id->master_addr, "gpu07");
  EXPECT_EQ(id->master_port, 10000 + 123456 % 50000);
  EXPECT_EQ(id->source, IdentitySource::kSlurm);
  auto last_node = identity_from_vars({{"SLURM_PROCID", "6"},
                                       {"SLURM_NTASKS", "7"},
                                       {"SLURM_LOCALID", "0"},
                                       {"SLURM_NODEID", "3"},
                                       {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                       {"SLURM_NODELIST", "a1,b2"}});
  ASSERT_TRUE(last_node.is_ok()) << last_node.status().to_string();
  EXPECT_EQ(last_node->local_world_size, 1);
  EXPECT_EQ(last_node->master_addr, "a1");
  EXPECT_EQ(last_node->master_port, 29500);
  auto per_node = identity_from_vars({{"SLURM_PROCID", "1"},
                                      {"SLURM_NTASKS", "4"},
                                      {"SLURM_LOCALID", "1"},
                                      {"SLURM_NTASKS_PER_NODE", "2"},
                                      {"SLURM_JOB_NODELIST", "host"},
                                      {"MASTER_PORT", "5000"}});
  ASSERT_TRUE(per_node.is_ok()) << per_node.status().to_string();
  EXPECT_EQ(per_node->local_world_size, 2);
  EXPECT_EQ(per_node->master_addr, "host");
  EXPECT_EQ(per_node->master_port, 5000);
}

TEST(Identity, NodeLists) {
  EXPECT_EQ(*first_host_of_nodelist("host"), "host");
  EXPECT_EQ(*first_host_of_nodelist("host[1-3,5]"), "host1");
  EXPECT_EQ(*first_host_of_nodelist("node[001-004]"), "node001");
  EXPECT_EQ(*first_host_of_nodelist("a[3],b[1-2]"), "a3");
  EXPECT_EQ(*first_host_of_nodelist("a,b[1-2]"), "a");
  EXPECT_EQ(*first_host_of_nodelist("rack[1-2]-n[5-6]"), "rack1-n5");
  EXPECT_EQ(*first_host_of_nodelist("n1.cluster.local,n2"), "n1.cluster.local");
  EXPECT_FALSE(first_host_of_nodelist("").is_ok());
  EXPECT_FALSE(first_host_of_nodelist("host[1-3").is_ok());
  EXPECT_FALSE(first_host_of_nodelist("host[]").is_ok());
  EXPECT_FALSE(first_host_of_nodelist("host[x-y]").is_ok());
  auto bad = identity_from_vars({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2"}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("SLURM_JOB_NODELIST"), std::string::npos) << bad.status().to_string();
}

void expect_error(const std::map<std::string, std::string>& vars, const std::string& needle) {
  auto id = identity_from_vars(vars);
  ASSERT_FALSE(id.is_ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find(needle), std::string::npos) << id.status().to_string();
}

TEST(Identity, Errors) {
  expect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}},
               "RANK=4 is outside the world of WORLD_SIZE=4");
  expect_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}, "RANK=-1");
  expect_error({{"RANK", "x"}, {"WORLD_SIZE", "4"}}, "RANK='x' is not an integer");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "4a"}}, "WORLD_SIZE='4a' is not an integer");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", ""}}, "WORLD_SIZE is set but empty");
  expect_error({{"RANK", "1"}}, "RANK is set but WORLD_SIZE is not");
  expect_error({{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "at least one rank");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, "MASTER_PORT is not set");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "99999999999"}}, "out of range");
  expect_error(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
      "LOCAL_RANK=2");
  expect_error({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK=2");
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"}}, "must both be set");
  expect_error({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID=3");
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x"}}, "SLURM_TASKS_PER_NODE");
  // Blanks around a number are tolerated.
  auto id = identity_from_vars({{"RANK", " 1 "}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id->rank, 1);
}

}  // namespace
}  // namespace keel::dist
