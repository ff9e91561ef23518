#include "loom/store/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "loom/common/error.h"
#include "loom/store/store.h"

namespace loom::auth {

namespace {

void fillRandom(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::getrandom(out + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    LOOM_CHECK_T(IoError, got > 0, "getrandom failed: ", detail::errnoText(errno));
    done += static_cast<size_t>(got);
  }
}

std::span<const uint8_t> bytesOf(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A challenge is written into a fresh socket's empty buffer: it never waits long.
constexpr milliseconds kChallengeWrite{1000};

}  // namespace

Key sharedKey(Store& store, const std::string& storeKey) {
  Key mine;
  fillRandom(mine.data(), mine.size());
  // compareSet creates the key when it is absent and otherwise returns what it holds: the
  // first caller's bytes, for everyone.
  const Bytes stored = store.compareSet(storeKey, {}, Bytes(mine.begin(), mine.end()));
  LOOM_CHECK_T(IoError, stored.size() == kKeyBytes, "the peer-authentication key under store key '",
               storeKey, "' holds ", stored.size(), " bytes; expected ", kKeyBytes,
               " (another program wrote that key?)");
  Key key;
  std::memcpy(key.data(), stored.data(), key.size());
  return key;
}

Nonce randomNonce() {
  Nonce n;
  fillRandom(n.data(), n.size());
  return n;
}

Mac hmac(const Key& key, std::initializer_list<std::span<const uint8_t>> parts) {
  // HMAC_CTX is deprecated in OpenSSL 3; EVP_MAC is the supported interface.
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  LOOM_CHECK_T(IoError, mac != nullptr, "OpenSSL: no HMAC implementation");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  LOOM_CHECK_T(IoError, ctx != nullptr, "OpenSSL: EVP_MAC_CTX_new failed");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  bool ok = EVP_MAC_init(ctx, key.data(), key.size(), params) == 1;
  for (const auto& part : parts) {
    ok = ok && EVP_MAC_update(ctx, part.data(), part.size()) == 1;
  }
  Mac out{};
  size_t len = 0;
  ok = ok && EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == out.size();
  EVP_MAC_CTX_free(ctx);
  LOOM_CHECK_T(IoError, ok, "OpenSSL: HMAC-SHA256 failed");
  return out;
}

bool macEquals(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Mac handshakeMac(const Key& key, std::string_view label, bool accept,
                 std::span<const uint8_t> opening, const Nonce& acceptorNonce) {
  const uint8_t sep = 0;
  return hmac(key, {bytesOf(label),
                    {&sep, 1},
                    bytesOf(accept ? "accept" : "dial"),
                    {&sep, 1},
                    opening,
                    acceptorNonce});
}

void dial(int fd, const Key& key, std::string_view label, std::span<const uint8_t> opening,
          const Deadline& deadline, const std::string& what) {
  net::writeFull(fd, opening.data(), opening.size(), deadline, what);
  Challenge challenge{};
  net::readFull(fd, &challenge, sizeof(challenge), deadline, what);
  if (!macEquals(challenge.mac, handshakeMac(key, label, true, opening, challenge.nonce))) {
    LOOM_THROW(AuthenticationError, what,
               " answered the authentication challenge with a wrong MAC: it does not hold this "
               "job's key (a stranger on that port, or a process of another job)");
  }
  const Proof proof{handshakeMac(key, label, false, opening, challenge.nonce)};
  net::writeFull(fd, &proof, sizeof(proof), deadline, what);
}

Inbound::Inbound(net::Socket sock, size_t openingBytes, Clock::time_point deadline)
    : sock_(std::move(sock)),
      address_(net::peerAddressOf(sock_.fd())),
      deadline_(deadline),
      opening_(openingBytes) {
  net::setNonBlocking(sock_.fd(), true);
}

Inbound::State Inbound::advance(const Key& key, std::string_view label, const Check& check) {
  if (!why_.empty()) return State::kFailed;
  auto fill = [&](uint8_t* buf, size_t need, size_t& have) {
    while (have < need) {
      const ssize_t n = ::recv(sock_.fd(), buf + have, need - have, 0);
      if (n > 0) {
        have += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) {
        why_ = "it closed the connection during the authentication handshake";
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        why_ = detail::str("reading its handshake failed: ", detail::errnoText(errno));
      }
      return false;
    }
    return true;
  };
  if (!challenged_) {
    if (!fill(opening_.data(), opening_.size(), have_)) {
      if (why_.empty() && Clock::now() >= deadline_) {
        why_ = detail::str("it sent ", have_, " of the ", opening_.size(),
                           " bytes of a handshake before its deadline");
      }
      return why_.empty() ? State::kPending : State::kFailed;
    }
    why_ = check(opening_);
    if (!why_.empty()) return State::kFailed;
    nonce_ = randomNonce();
    const Challenge challenge{nonce_, handshakeMac(key, label, true, opening_, nonce_)};
    try {
      net::writeFull(sock_.fd(), &challenge, sizeof(challenge), Deadline(kChallengeWrite),
                     address_);
    } catch (const std::exception& e) {
      why_ = detail::str("sending it the challenge failed: ", e.what());
      return State::kFailed;
    }
    challenged_ = true;
  }
  if (!fill(proof_.mac.data(), proof_.mac.size(), proofHave_)) {
    if (why_.empty() && Clock::now() >= deadline_) {
      why_ = "it did not answer the authentication challenge before its deadline";
    }
    return why_.empty() ? State::kPending : State::kFailed;
  }
  if (!macEquals(proof_.mac, handshakeMac(key, label, false, opening_, nonce_))) {
    why_ =
        "it answered the authentication challenge with a wrong MAC (it does not hold this "
        "job's key)";
    return State::kFailed;
  }
  net::setNonBlocking(sock_.fd(), false);
  return State::kDone;
}

int InboundSet::acceptAll(int listenFd, Clock::time_point deadline,
                          std::vector<std::string>& dropped) {
  for (;;) {
    net::Socket sock(::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock.valid()) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      const int error = errno;
      const Clock::time_point now = Clock::now();
      const bool first = acceptErrno_ == 0;
      if (first) failingSince_ = now;
      acceptErrno_ = error;
      ++acceptFailures_;
      backoffUntil_ = now + kAcceptBackoff;
      return first ? error : 0;
    }
    acceptErrno_ = 0;
    acceptFailures_ = 0;
    if (!pending_.empty() && pending_.size() >= limit_) {
      dropped.push_back(pending_.front().address());
      pending_.erase(pending_.begin());
    }
    pending_.emplace_back(std::move(sock), openingBytes_, deadline);
  }
}

pollfd InboundSet::listenerPollFd(int listenFd, Clock::time_point& wake) const {
  if (acceptErrno_ != 0 && Clock::now() < backoffUntil_) {
    wake = std::min(wake, backoffUntil_);
    return {listenFd, 0, 0};
  }
  return {listenFd, POLLIN, 0};
}

std::string InboundSet::acceptFailure() const {
  if (acceptErrno_ == 0) return {};
  const auto since =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - failingSince_).count();
  std::string limit;
  if (acceptErrno_ == EMFILE || acceptErrno_ == ENFILE) {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
      limit = detail::str("; this process may open ", r.rlim_cur,
                          " descriptors (ulimit -n; RLIMIT_NOFILE, hard limit ", r.rlim_max, ")");
    }
  }
  return detail::str("accept failed ", acceptFailures_, acceptFailures_ == 1 ? " time" : " times",
                     " over ", since, " ms: ", detail::errnoText(acceptErrno_),
                     "; the connections wait in the listen queue", limit);
}

Clock::duration InboundSet::outOfDescriptorsFor() const {
  if (acceptErrno_ != EMFILE && acceptErrno_ != ENFILE) return Clock::duration::zero();
  return Clock::now() - failingSince_;
}

void InboundSet::addPollFds(std::vector<pollfd>& fds, Clock::time_point& wake) const {
  for (const Inbound& in : pending_) {
    fds.push_back({in.fd(), POLLIN, 0});
    wake = std::min(wake, in.deadline());
  }
}

void InboundSet::advance(std::span<const pollfd> fds, size_t first, const Key& key,
                         std::string_view label, const Inbound::Check& check,
                         std::vector<Accepted>& done, std::vector<Refused>& refused) {
  const Clock::time_point now = Clock::now();
  std::vector<Inbound> still;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Inbound& in = pending_[i];
    const bool ready = first + i < fds.size() && fds[first + i].revents != 0;
    if (!ready && now < in.deadline()) {
      still.push_back(std::move(in));
      continue;
    }
    Inbound::State state = Inbound::State::kFailed;
    std::string why;
    try {
      state = in.advance(key, label, check);
      why = in.why();
    } catch (const std::exception& e) {
      why = detail::str("its handshake failed here: ", e.what());
    }
    if (state == Inbound::State::kPending) {
      still.push_back(std::move(in));
    } else if (state == Inbound::State::kFailed) {
      refused.push_back({in.address(), std::move(why)});
    } else {
      done.push_back({in.opening(), in.release()});
    }
  }
  pending_ = std::move(still);
}

}  // namespace loom::auth
