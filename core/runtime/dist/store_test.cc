// store_test — the rendezvous stores: set/get/add/wait/check/erase on the in-process and the TCP store (one suite,
// both), timeouts that name the key and end in time, prefixes, the C view that collective plugins use, many clients
// from threads, malformed frames that close only their own connection, a port in use, an unreachable server.
// Servers bind 127.0.0.1 on a free port.
#include "core/runtime/dist/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace keel::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One store under test, with the server behind it when it is the TCP one.
struct Fixture {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;
  // Another handle on the same store (a second client for TCP).
  std::function<std::shared_ptr<Store>()> another;
};

Fixture make(const std::string& kind) {
  Fixture f;
  if (kind == "inprocess") {
    f.store = std::make_shared<InProcessStore>();
    auto s = f.store;
    f.another = [s] { return s; };
  } else {
    auto server = TcpStoreServer::start("127.0.0.1", 0);
    EXPECT_TRUE(server.is_ok()) << server.status().to_string();
    f.server = std::move(server).value();
    const int port = f.server->port();
    auto connect = [port]() -> std::shared_ptr<Store> {
      auto c = TcpStore::connect("127.0.0.1", port, 5000);
      EXPECT_TRUE(c.is_ok()) << c.status().to_string();
      return c.is_ok() ? std::shared_ptr<Store>(std::move(c).value()) : nullptr;
    };
    f.store = connect();
    f.another = connect;
  }
  return f;
}

class StoreTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreTest, SetGetAddCheckEraseNumKeys) {
  Fixture f = make(GetParam());
  Store& s = *f.store;
  ASSERT_TRUE(s.set("a", "hello").is_ok());
  ASSERT_TRUE(s.set("bin", std::string("\0x\xff", 3)).is_ok());
  auto a = s.get("a", 0);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(*a, "hello");
  EXPECT_EQ(*s.get("bin", 100), std::string("\0x\xff", 3));
  ASSERT_TRUE(s.set("a", "again").is_ok());
  EXPECT_EQ(*s.get("a", 0), "again");
  EXPECT_EQ(*s.add("n", 5), 5);
  EXPECT_EQ(*s.add("n", -2), 3);
  EXPECT_EQ(*s.get("n", 0), "3");
  auto bad = s.add("a", 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'a'"), std::string::npos) << bad.status().to_string();
  EXPECT_TRUE(*s.check({"a", "n"}));
  EXPECT_FALSE(*s.check({"a", "missing"}));
  EXPECT_EQ(*s.num_keys(), 3);
  EXPECT_TRUE(*s.erase("a"));
  EXPECT_FALSE(*s.erase("a"));
  EXPECT_EQ(*s.num_keys(), 2);
  ASSERT_TRUE(s.set("empty", "").is_ok());
  EXPECT_EQ(*s.get("empty", 0), "");
}

TEST_P(StoreTest, GetAndWaitTimeOutNamingTheKey) {
  Fixture f = make(GetParam());
  auto t0 = Clock::now();
  auto v = f.store->get("never/set", 200);
  EXPECT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("'never/set'"), std::string::npos) << v.status().to_string();
  EXPECT_GE(seconds_since(t0), 0.19);
  EXPECT_LT(seconds_since(t0), 3.0);
  ASSERT_TRUE(f.store->set("k1", "1").is_ok());
  Status w = f.store->wait({"k1", "k2"}, 100);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("'k2'"), std::string::npos) << w.to_string();
  // No waiting at all with timeout 0.
  t0 = Clock::now();
  EXPECT_FALSE(f.store->get("k2", 0).is_ok());
  EXPECT_LT(seconds_since(t0), 1.0);
  // The connection is still good after timeouts.
  EXPECT_EQ(*f.store->get("k1", 0), "1");
}

TEST_P(StoreTest, WaitReturnsWhenAnotherClientSets) {
  Fixture f = make(GetParam());
  auto other = f.another();
  ASSERT_TRUE(other);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(other->set("late", "v").is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(other->add("later", 7).is_ok());
  });
  auto t0 = Clock::now();
  auto v = f.store->get("late", 5000);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(*v, "v");
  EXPECT_TRUE(f.store->wait({"late", "later"}, 5000).is_ok());
  EXPECT_LT(seconds_since(t0), 3.0);
  setter.join();
}

TEST_P(StoreTest, PrefixesKeepGroupsApart) {
  Fixture f = make(GetParam());
  PrefixStore g0(f.store, "pg/0"), g1(f.store, "pg/1");
  ASSERT_TRUE(g0.set("x", "zero").is_ok());
  ASSERT_TRUE(g1.set("x", "one").is_ok());
  EXPECT_EQ(*g0.get("x", 0), "zero");
  EXPECT_EQ(*g1.get("x", 0), "one");
  EXPECT_EQ(*f.store->get("pg/0/x", 0), "zero");
  EXPECT_EQ(*g0.add("c", 2), 2);
  EXPECT_FALSE(*g1.check({"c"}));
  auto miss = g1.get("c", 50);
  EXPECT_NE(miss.status().message().find("'pg/1/c'"), std::string::npos) << miss.status().to_string();
  EXPECT_NE(g0.describe().find("pg/0"), std::string::npos);
}

TEST_P(StoreTest, CViewWaitsWithTimeoutAndKeepsValues) {
  Fixture f = make(GetParam());
  keel_kv_store_t* c = f.store->c_store();
  ASSERT_EQ(c->struct_size, sizeof(keel_kv_store_t));
  ASSERT_EQ(c->set(c, "id", "abc", 3), nullptr);
  const void* v1 = nullptr;
  size_t n1 = 0;
  ASSERT_EQ(c->get(c, "id", 100, &v1, &n1), nullptr);
  ASSERT_EQ(c->set(c, "id2", "defg", 4), nullptr);
  const void* v2 = nullptr;
  size_t n2 = 0;
  ASSERT_EQ(c->get(c, "id2", 100, &v2, &n2), nullptr);
  // The first value stays valid after later gets.
  EXPECT_EQ(std::string(static_cast<const char*>(v1), n1), "abc");
  EXPECT_EQ(std::string(static_cast<const char*>(v2), n2), "defg");
  keel_status_t st = c->get(c, "absent", 50, &v1, &n1);
  ASSERT_NE(st, nullptr);
  Status s = Status::from_c(st);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("'absent'"), std::string::npos) << s.to_string();
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  Fixture f = make(GetParam());
  constexpr int kThreads = 8, kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      auto s = f.another();
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(s->add("counter", 1).is_ok());
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(*f.store->add("counter", 0), kThreads * kAdds);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("inprocess", "tcp"));

// Many clients, each from its own thread: every one registers and waits for all the others (a rendezvous).
TEST(TcpStore, ManyClientsRendezvous) {
  auto server = TcpStoreServer::start();
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  EXPECT_EQ((*server)->host(), "127.0.0.1");
  const int port = (*server)->port();
  constexpr int kClients = 32;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kClients; ++r)
    threads.emplace_back([&, r] {
      auto c = TcpStore::connect("127.0.0.1", port, 5000);
      if (!c.is_ok()) return ADD_FAILURE() << c.status().to_string();
      if (!(*c)->set("rank/" + std::to_string(r), std::to_string(r)).is_ok()) return;
      std::vector<std::string> keys;
      for (int k = 0; k < kClients; ++k) keys.push_back("rank/" + std::to_string(k));
      Status w = (*c)->wait(keys, 10000);
      if (!w.is_ok()) return ADD_FAILURE() << w.to_string();
      auto v = (*c)->get("rank/" + std::to_string((r + 1) % kClients), 0);
      if (v.is_ok() && *v == std::to_string((r + 1) % kClients)) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
}

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the server closes fd within timeout_ms (recv sees EOF or a reset).
bool closed_by_server(int fd, int timeout_ms) {
  const auto t0 = Clock::now();
  char buf[256];
  while (seconds_since(t0) * 1000 < timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
  }
  return false;
}

TEST(TcpStore, MalformedFramesCloseOnlyThatClient) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  const int port = (*server)->port();
  auto good = TcpStore::connect("127.0.0.1", port, 5000);
  ASSERT_TRUE(good.is_ok());
  ASSERT_TRUE((*good)->set("before", "1").is_ok());
  const std::vector<std::string> bad_frames = {
      std::string("\xff\xff\xff\xff", 4),                                       // 4 GiB frame
      std::string("\x01\x00\x00\x00\x63", 5),                                   // unknown op 99
      std::string("\x05\x00\x00\x00\x01\xff\x00\x00\x00", 9),                   // set: key length runs past the frame
      std::string("\x02\x00\x00\x00\x06\x00", 6),                               // num_keys with a trailing byte
      std::string("\x09\x00\x00\x00\x04\xff\xff\xff\x7f\x00\x00\x00\x00", 13),  // wait: 2^31 keys in 9 bytes
  };
  for (const auto& frame : bad_frames) {
    int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
    EXPECT_TRUE(closed_by_server(fd, 3000)) << "frame of " << frame.size() << " bytes";
    close(fd);
  }
  // A client that vanishes mid-frame and one that vanishes while waiting.
  {
    int fd = raw_connect(port);
    ASSERT_EQ(send(fd, "\x40\x00\x00\x00\x01", 5, MSG_NOSIGNAL), 5);
    close(fd);
    auto waiter = TcpStore::connect("127.0.0.1", port, 5000);
    ASSERT_TRUE(waiter.is_ok());
    std::thread t([&] { (void)(*waiter)->get("never", 300); });
    t.join();
  }
  // The server still serves the good client and new ones.
  EXPECT_EQ(*(*good)->get("before", 0), "1");
  auto fresh = TcpStore::connect("127.0.0.1", port, 5000);
  ASSERT_TRUE(fresh.is_ok());
  ASSERT_TRUE((*fresh)->set("after", "2").is_ok());
  EXPECT_EQ(*(*good)->get("after", 1000), "2");
}

// Random bytes from many clients (seeded): the server stays up and keeps answering.
TEST(TcpStore, RandomGarbageDoesNotKillTheServer) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok());
  const int port = (*server)->port();
  std::mt19937 rng(1234);
  for (int i = 0; i < 60; ++i) {
    int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    std::string junk(1 + rng() % 64, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    if (i % 3 == 0 && junk.size() >= 5) {  // a small frame length, so that the body is parsed
      junk[0] = static_cast<char>(junk.size() - 4);
      junk[1] = junk[2] = junk[3] = 0;
    }
    (void)send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    close(fd);
  }
  auto c = TcpStore::connect("127.0.0.1", port, 5000);
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE((*c)->set("alive", "yes").is_ok());
  EXPECT_EQ(*(*c)->get("alive", 1000), "yes");
}

TEST(TcpStore, PortInUseIsNamed) {
  auto first = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(first.is_ok());
  const int port = (*first)->port();
  auto second = TcpStoreServer::start("127.0.0.1", port);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port) + " is in use"), std::string::npos)
      << second.status().to_string();
}

TEST(TcpStore, UnreachableServerIsDeadlineExceededNamingTheAddress) {
  // A port that nothing listens on: bind one, read it back, close it.
  int port = 0;
  {
    auto s = TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.is_ok());
    port = (*s)->port();
  }
  auto t0 = Clock::now();
  auto c = TcpStore::connect("127.0.0.1", port, 300);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().to_string();
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(TcpStore, ClientConnectsToAServerThatStartsLater) {
  int port = 0;
  {
    auto s = TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.is_ok());
    port = (*s)->port();
  }
  std::unique_ptr<TcpStoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto s = TcpStoreServer::start("127.0.0.1", port);
    if (s.is_ok()) late = std::move(s).value();
  });
  auto c = TcpStore::connect("127.0.0.1", port, 5000);
  starter.join();
  if (!late) GTEST_SKIP() << "the port was taken by someone else meanwhile";
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE((*c)->set("x", "y").is_ok());
}

TEST(TcpStore, ServerGoingAwayIsUnavailableNotAHang) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok());
  auto c = TcpStore::connect("127.0.0.1", (*server)->port(), 5000);
  ASSERT_TRUE(c.is_ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    (*server)->stop();
  });
  auto t0 = Clock::now();
  auto v = (*c)->get("never", 10000);
  stopper.join();
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().to_string();
  EXPECT_LT(seconds_since(t0), 5.0);
  auto again = (*c)->set("x", "y");
  EXPECT_FALSE(again.is_ok());
}

TEST(TcpStore, BadArgumentsAreErrors) {
  EXPECT_EQ(TcpStoreServer::start("", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStoreServer::start("127.0.0.1", 70000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::connect("127.0.0.1", 0, 100).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace keel::dist
