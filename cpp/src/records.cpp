#include "speedmatrix/records.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace speedmatrix {

void NsColumn::push_back(ns_t t) {
  if (blocks_.empty() || t < blocks_.back().base ||
      static_cast<std::uint64_t>(t - blocks_.back().base) >
          std::numeric_limits<std::uint32_t>::max()) {
    blocks_.push_back({t, offsets_.size()});
  }
  offsets_.push_back(static_cast<std::uint32_t>(t - blocks_.back().base));
}

ns_t NsColumn::operator[](std::size_t i) const {
  // the last block whose first entry is <= i
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), i,
                             [](std::size_t v, const Block& b) { return v < b.first; });
  return std::prev(it)->base + static_cast<ns_t>(offsets_[i]);
}

std::vector<ns_t> NsColumn::to_vector() const {
  std::vector<ns_t> out(offsets_.size());
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    std::size_t end = b + 1 < blocks_.size() ? blocks_[b + 1].first : offsets_.size();
    for (std::size_t i = blocks_[b].first; i < end; ++i)
      out[i] = blocks_[b].base + static_cast<ns_t>(offsets_[i]);
  }
  return out;
}

std::size_t NsColumn::memory_bytes() const noexcept {
  return offsets_.capacity() * sizeof(std::uint32_t) + blocks_.capacity() * sizeof(Block);
}

void CountColumn::push_back(std::int32_t v) {
  if (v >= 0 && v < kEscape) {
    small_.push_back(static_cast<std::uint16_t>(v));
  } else {
    large_.emplace_back(small_.size(), v);
    small_.push_back(kEscape);
  }
}

std::int32_t CountColumn::operator[](std::size_t i) const {
  if (small_[i] != kEscape) return small_[i];
  auto it = std::lower_bound(large_.begin(), large_.end(), i,
                             [](const auto& e, std::size_t v) { return e.first < v; });
  return it->second;
}

std::vector<std::int32_t> CountColumn::to_vector() const {
  std::vector<std::int32_t> out(small_.begin(), small_.end());
  for (const auto& [i, v] : large_) out[i] = v;
  return out;
}

std::size_t CountColumn::memory_bytes() const noexcept {
  return small_.capacity() * sizeof(std::uint16_t) +
         large_.capacity() * sizeof(std::pair<std::size_t, std::int32_t>);
}

void StampColumn::push_back(ns_t v) {
  if (!dense_ && v != kNever) {
    values_.assign(n_, kNever);
    dense_ = true;
  }
  if (dense_) values_.push_back(v);
  ++n_;
}

std::vector<ns_t> StampColumn::to_vector() const {
  return dense_ ? values_ : std::vector<ns_t>(n_, kNever);
}

void NsColumn::clear() noexcept {
  blocks_.clear();
  offsets_.clear();
}

void CountColumn::clear() noexcept {
  small_.clear();
  large_.clear();
}

void StampColumn::clear() noexcept {
  n_ = 0;
  dense_ = false;
  values_.clear();
}

template <class T>
PlainColumn<T>& PlainColumn<T>::operator=(PlainColumn&& o) noexcept {
  if (this != &o) {
    release();
    owned_ = std::move(o.owned_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    n_ = o.n_;
    o.map_ = nullptr;
    o.map_bytes_ = o.n_ = 0;
  }
  return *this;
}

template <class T>
void PlainColumn<T>::release() noexcept {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = n_ = 0;
}

template class PlainColumn<std::int32_t>;
template class PlainColumn<ns_t>;

namespace {

// Bytes per value of each spill file: request, t_ns, tokens, server_ns.
constexpr std::size_t kWidth[4] = {sizeof(std::int32_t), sizeof(ns_t), sizeof(std::int32_t),
                                   sizeof(ns_t)};

// An unlinked file in `dir`: nothing is left behind whatever way the process ends.
int open_spill_file(const std::string& dir, int* err, const char* name) {
#ifdef O_TMPFILE
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
#endif
  // O_TMPFILE unsupported by the filesystem (or the kernel): a named file, unlinked at once.
  std::string path = dir + "/speedmatrix-" + name + "-XXXXXX";
  fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  ::unlink(path.c_str());
  return fd;
}

// Opens one unlinked spill file per entry of `fds`, in `dir` ("" = $TMPDIR, else /tmp;
// resolved in place, so a failure message can name it). 0, or the errno of the first file
// that could not be made (those made before it stay open in `fds`).
template <std::size_t N>
int open_spill_files(std::string& dir, int (&fds)[N], const char* name) {
  if (dir.empty()) {
    const char* env = std::getenv("TMPDIR");
    dir = env && *env ? env : "/tmp";
  }
  for (int& fd : fds) {
    int err = 0;
    fd = open_spill_file(dir, &err, name);
    if (fd < 0) return err;
  }
  return 0;
}

template <std::size_t N>
void close_spill_files(int (&fds)[N]) noexcept {
  for (int& fd : fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

int pwrite_all(int fd, const void* buf, std::size_t bytes, off_t off) {
  const char* p = static_cast<const char*>(buf);
  while (bytes > 0) {
    const ssize_t w = ::pwrite(fd, p, bytes, off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    bytes -= static_cast<std::size_t>(w);
    off += w;
  }
  return 0;
}

void pread_all(int fd, void* buf, std::size_t bytes, off_t off, const char* what = "token events") {
  char* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, p, bytes, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw std::runtime_error(std::string("reading spilled ") + what + ": " +
                               (r < 0 ? std::strerror(errno) : "file shorter than written"));
    p += r;
    bytes -= static_cast<std::size_t>(r);
    off += r;
  }
}

// Event i of one column: from the in-memory tail when it has not been spilled, else one
// pread from that column's spill file (plain values, sizeof(T) each).
template <class T, class Tail>
T value_at(const Tail& tail, int fd, std::size_t i, std::size_t spilled) {
  if (i >= spilled) return tail[i - spilled];
  T v;
  pread_all(fd, &v, sizeof v, static_cast<off_t>(i * sizeof v));
  return v;
}

}  // namespace

EventColumns::EventColumns(EventColumns&& o) noexcept { *this = std::move(o); }

EventColumns& EventColumns::operator=(EventColumns&& o) noexcept {
  if (this != &o) {
    close_files();
    threshold_ = o.threshold_;
    dir_ = std::move(o.dir_);
    spilled_ = o.spilled_;
    disabled_ = o.disabled_;
    note_ = std::move(o.note_);
    for (int c = 0; c < 4; ++c) {
      fd_[c] = o.fd_[c];
      o.fd_[c] = -1;
    }
    request_ = std::move(o.request_);
    t_ns_ = std::move(o.t_ns_);
    tokens_ = std::move(o.tokens_);
    server_ns_ = std::move(o.server_ns_);
    o.spilled_ = 0;
    o.request_.clear();
    o.t_ns_.clear();
    o.tokens_.clear();
    o.server_ns_.clear();
  }
  return *this;
}

EventColumns::~EventColumns() { close_files(); }

void EventColumns::close_files() noexcept { close_spill_files(fd_); }

void EventColumns::configure_spill(std::size_t threshold, std::string dir) {
  threshold_ = threshold;
  dir_ = std::move(dir);
}

void EventColumns::reserve(std::size_t n) {
  if (threshold_ > 0) n = std::min(n, threshold_);
  request_.reserve(n);
  t_ns_.reserve(n);
  tokens_.reserve(n);
  server_ns_.reserve(n);
}

void EventColumns::push(std::int32_t request, ns_t t_ns, std::int32_t tokens, ns_t server_ns) {
  request_.push_back(request);
  t_ns_.push_back(t_ns);
  tokens_.push_back(tokens);
  server_ns_.push_back(server_ns);
  if (threshold_ > 0 && !disabled_ && t_ns_.size() >= threshold_) spill();
}

void EventColumns::fail(const std::string& what, int err) {
  disabled_ = true;
  const std::string dir = dir_.empty() ? "the temporary directory" : dir_;
  note_ = "token events kept in memory: " + what + " in " + dir + " failed (" + std::strerror(err) +
          ")";
  if (spilled_ == 0) close_files();  // else the files hold events [0, spilled_)
}

bool EventColumns::spill() {
  const std::size_t n = t_ns_.size();
  if (n == 0 || disabled_) return !disabled_;
  if (fd_[0] < 0) {
    if (int err = open_spill_files(dir_, fd_, "events")) {
      fail("creating a spill file", err);
      return false;
    }
  }
  struct Out {
    std::int32_t request[kReadBlock];
    ns_t t_ns[kReadBlock];
    std::int32_t tokens[kReadBlock];
    ns_t server_ns[kReadBlock];
  };
  auto out = std::make_unique<Out>();
  const void* cols[4] = {out->request, out->t_ns, out->tokens, out->server_ns};
  for (std::size_t from = 0; from < n; from += kReadBlock) {
    const std::size_t m = std::min(kReadBlock, n - from);
    for (std::size_t k = 0; k < m; ++k) {
      out->request[k] = request_[from + k];
      out->t_ns[k] = t_ns_[from + k];
      out->tokens[k] = tokens_[from + k];
      out->server_ns[k] = server_ns_[from + k];
    }
    for (int c = 0; c < 4; ++c) {
      // Written past spilled_ only: a failure leaves the committed events intact.
      const auto off = static_cast<off_t>((spilled_ + from) * kWidth[c]);
      if (int err = pwrite_all(fd_[c], cols[c], m * kWidth[c], off)) {
        fail("writing the spill file", err);
        return false;
      }
    }
  }
  spilled_ += n;
  request_.clear();
  t_ns_.clear();
  tokens_.clear();
  server_ns_.clear();
  return true;
}

void EventColumns::read_spilled(std::size_t from, std::size_t n, Block& b) const {
  pread_all(fd_[0], b.request, n * kWidth[0], static_cast<off_t>(from * kWidth[0]));
  pread_all(fd_[1], b.t_ns, n * kWidth[1], static_cast<off_t>(from * kWidth[1]));
  pread_all(fd_[2], b.tokens, n * kWidth[2], static_cast<off_t>(from * kWidth[2]));
}

std::int32_t EventColumns::request(std::size_t i) const {
  return value_at<std::int32_t>(request_, fd_[0], i, spilled_);
}

ns_t EventColumns::t_ns(std::size_t i) const { return value_at<ns_t>(t_ns_, fd_[1], i, spilled_); }

std::int32_t EventColumns::tokens(std::size_t i) const {
  return value_at<std::int32_t>(tokens_, fd_[2], i, spilled_);
}

ns_t EventColumns::server_ns(std::size_t i) const {
  return value_at<ns_t>(server_ns_, fd_[3], i, spilled_);
}

std::size_t EventColumns::memory_bytes() const noexcept {
  return request_.capacity() * sizeof(std::int32_t) + t_ns_.memory_bytes() +
         tokens_.memory_bytes() + server_ns_.memory_bytes();
}

EventColumns::Plain EventColumns::plain_copy() const {
  const std::size_t n = size();
  std::vector<std::int32_t> req(n), tok(n);
  std::vector<ns_t> t(n), srv(n);
  for_each(0, n, [&](std::size_t i, std::int32_t q, ns_t at, std::int32_t k) {
    req[i] = q;
    t[i] = at;
    tok[i] = k;
  });
  if (spilled_ > 0) pread_all(fd_[3], srv.data(), spilled_ * kWidth[3], 0);
  for (std::size_t i = spilled_; i < n; ++i) srv[i] = server_ns_[i - spilled_];
  Plain p;
  p.request = PlainColumn<std::int32_t>(std::move(req));
  p.t_ns = PlainColumn<ns_t>(std::move(t));
  p.tokens = PlainColumn<std::int32_t>(std::move(tok));
  p.server_ns = PlainColumn<ns_t>(std::move(srv));
  return p;
}

EventColumns::Plain EventColumns::take_plain() {
  Plain p;
  const std::size_t n = size();
  bool done = false;
  if (spilled_ > 0 && !disabled_ && spill()) {
    // Everything is in the files now: map them (private, so numpy may even write; pages
    // come from the page cache, not anonymous memory, until written).
    void* maps[4] = {nullptr, nullptr, nullptr, nullptr};
    bool ok = true;
    for (int c = 0; c < 4 && ok; ++c) {
      maps[c] = ::mmap(nullptr, n * kWidth[c], PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_[c], 0);
      if (maps[c] == MAP_FAILED) {
        maps[c] = nullptr;
        const int err = errno;
        ok = false;
        note_ = std::string("token events read back into memory: mapping the spill file failed (") +
                std::strerror(err) + ")";
      }
    }
    if (ok) {
      p.request = PlainColumn<std::int32_t>(maps[0], n * kWidth[0], n);
      p.t_ns = PlainColumn<ns_t>(maps[1], n * kWidth[1], n);
      p.tokens = PlainColumn<std::int32_t>(maps[2], n * kWidth[2], n);
      p.server_ns = PlainColumn<ns_t>(maps[3], n * kWidth[3], n);
      done = true;
    } else {
      for (int c = 0; c < 4; ++c)
        if (maps[c]) ::munmap(maps[c], n * kWidth[c]);
    }
  }
  if (!done && spilled_ > 0) {
    // A spill failed (or the mapping did): read the files back once, then the tail.
    p = plain_copy();
    done = true;
  }
  if (!done) {
    p.request = PlainColumn<std::int32_t>(std::move(request_));
    p.t_ns = PlainColumn<ns_t>(t_ns_.to_vector());
    p.tokens = PlainColumn<std::int32_t>(tokens_.to_vector());
    p.server_ns = PlainColumn<ns_t>(server_ns_.to_vector());
  }
  close_files();  // a mapping keeps its file; the unlinked files vanish with the last one
  spilled_ = 0;
  request_ = {};
  t_ns_.clear();
  tokens_.clear();
  server_ns_.clear();
  return p;
}

// ---- RequestLog ----

static_assert(sizeof(RequestLog::Row) == 128, "the spill row is 128 bytes");

RequestLog::RequestLog() = default;
RequestLog::RequestLog(RequestLog&& o) noexcept { *this = std::move(o); }

RequestLog& RequestLog::operator=(RequestLog&& o) noexcept {
  if (this != &o) {
    close_files();
    threshold_ = o.threshold_;
    next_try_ = o.next_try_;
    dir_ = std::move(o.dir_);
    spilled_ = o.spilled_;
    text_bytes_ = o.text_bytes_;
    disabled_ = o.disabled_;
    note_ = std::move(o.note_);
    for (int c = 0; c < 2; ++c) {
      fd_[c] = o.fd_[c];
      o.fd_[c] = -1;
    }
    tail_ = std::move(o.tail_);
    cache_.clear();
    o.spilled_ = 0;
    o.text_bytes_ = 0;
    o.tail_.clear();
  }
  return *this;
}

RequestLog::~RequestLog() { close_files(); }

void RequestLog::close_files() noexcept { close_spill_files(fd_); }

void RequestLog::configure_spill(std::size_t threshold, std::string dir) {
  threshold_ = threshold;
  next_try_ = threshold;
  dir_ = std::move(dir);
}

RequestRecord& RequestLog::operator[](std::size_t i) {
  if (i < spilled_)
    throw std::logic_error("request record " + std::to_string(i) +
                           " was spilled: it can be read, not changed");
  return tail_[i - spilled_];
}

const RequestRecord& RequestLog::operator[](std::size_t i) const {
  if (i >= spilled_) return tail_[i - spilled_];
  read_spilled(i, 1, cache_);
  return cache_[0];
}

std::size_t RequestLog::memory_bytes() const noexcept {
  return (tail_.capacity() + cache_.capacity()) * sizeof(RequestRecord);
}

void RequestLog::fail(const std::string& what, int err) {
  disabled_ = true;
  const std::string dir = dir_.empty() ? "the temporary directory" : dir_;
  note_ = "request records kept in memory: " + what + " in " + dir + " failed (" +
          std::strerror(err) + ")";
  if (spilled_ == 0) close_files();  // else the files hold records [0, spilled_)
}

void RequestLog::spill_finished(ns_t before_ns) {
  if (threshold_ == 0 || disabled_ || tail_.size() < next_try_) return;
  std::size_t k = 0;
  while (k < tail_.size() && tail_[k].outcome != Outcome::kPending && tail_[k].done_ns != kNever &&
         tail_[k].done_ns < before_ns)
    ++k;
  next_try_ = tail_.size() + std::max<std::size_t>(threshold_ / 4, 1);
  if (k == 0) return;
  if (fd_[0] < 0) {
    if (int err = open_spill_files(dir_, fd_, "requests")) {
      fail("creating a spill file", err);
      return;
    }
  }
  std::vector<Row> rows(k);
  std::string text;
  for (std::size_t i = 0; i < k; ++i) {
    const RequestRecord& r = tail_[i];
    Row& w = rows[i];
    w = Row{};
    w.scheduled_ns = r.scheduled_ns;
    w.sent_ns = r.sent_ns;
    w.first_byte_ns = r.first_byte_ns;
    w.first_token_ns = r.first_token_ns;
    w.first_content_ns = r.first_content_ns;
    w.done_ns = r.done_ns;
    w.prompt_tokens = r.prompt_tokens;
    w.output_tokens = r.output_tokens;
    w.reasoning_tokens = r.reasoning_tokens;
    w.cached_tokens = r.cached_tokens;
    w.reasoning_deltas = r.reasoning_deltas;
    w.text_off = text_bytes_ + text.size();
    w.slot = r.slot;
    w.body = r.body;
    w.http_status = r.http_status;
    w.retries = r.retries;
    w.finish_len = static_cast<std::uint32_t>(r.finish_reason.size());
    w.kind_len = static_cast<std::uint32_t>(r.error_kind.size());
    w.message_len = static_cast<std::uint32_t>(r.error_message.size());
    w.phase = static_cast<std::uint8_t>(r.phase);
    w.token_source = static_cast<std::uint8_t>(r.token_source);
    w.outcome = static_cast<std::uint8_t>(r.outcome);
    text += r.finish_reason;
    text += r.error_kind;
    text += r.error_message;
  }
  // Written past what is committed only: a failure leaves the spilled records intact.
  if (int err = pwrite_all(fd_[0], rows.data(), k * sizeof(Row),
                           static_cast<off_t>(spilled_ * sizeof(Row)))) {
    fail("writing the spill file", err);
    return;
  }
  if (int err = pwrite_all(fd_[1], text.data(), text.size(), static_cast<off_t>(text_bytes_))) {
    fail("writing the spill file", err);
    return;
  }
  spilled_ += k;
  text_bytes_ += text.size();
  tail_.erase(tail_.begin(), tail_.begin() + static_cast<std::ptrdiff_t>(k));
  next_try_ = std::max(threshold_, tail_.size() + std::max<std::size_t>(threshold_ / 4, 1));
}

void RequestLog::read_spilled(std::size_t from, std::size_t n,
                              std::vector<RequestRecord>& out) const {
  out.resize(n);
  if (n == 0) return;
  std::vector<Row> rows(n);
  pread_all(fd_[0], rows.data(), n * sizeof(Row), static_cast<off_t>(from * sizeof(Row)),
            "request records");
  const Row& last = rows.back();
  const std::uint64_t begin = rows.front().text_off;
  const std::uint64_t end =
      last.text_off + std::uint64_t{last.finish_len} + last.kind_len + last.message_len;
  std::string text(end - begin, '\0');
  if (!text.empty())
    pread_all(fd_[1], text.data(), text.size(), static_cast<off_t>(begin), "request records");
  for (std::size_t k = 0; k < n; ++k) {
    const Row& w = rows[k];
    RequestRecord& r = out[k];
    r.slot = w.slot;
    r.body = w.body;
    r.phase = static_cast<Phase>(w.phase);
    r.scheduled_ns = w.scheduled_ns;
    r.sent_ns = w.sent_ns;
    r.first_byte_ns = w.first_byte_ns;
    r.first_token_ns = w.first_token_ns;
    r.first_content_ns = w.first_content_ns;
    r.done_ns = w.done_ns;
    r.http_status = w.http_status;
    r.prompt_tokens = w.prompt_tokens;
    r.output_tokens = w.output_tokens;
    r.reasoning_tokens = w.reasoning_tokens;
    r.cached_tokens = w.cached_tokens;
    r.reasoning_deltas = w.reasoning_deltas;
    r.token_source = static_cast<TokenSource>(w.token_source);
    r.outcome = static_cast<Outcome>(w.outcome);
    r.retries = w.retries;
    std::size_t at = w.text_off - begin;
    r.finish_reason.assign(text, at, w.finish_len);
    at += w.finish_len;
    r.error_kind.assign(text, at, w.kind_len);
    at += w.kind_len;
    r.error_message.assign(text, at, w.message_len);
  }
}

}  // namespace speedmatrix
