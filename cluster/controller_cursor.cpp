#include "cluster/controller_impl.hpp"

#include "runtime/file_io.hpp"

#include <algorithm>
#include <limits>

namespace troupe::cluster {

// ---- event cursors -------------------------------------------------------

namespace {

class cursor final : public event_cursor {
public:
  cursor(std::weak_ptr<controller::impl> ctl, std::string id, int64_t from,
         std::function<void()> wake)
      : ctl_(std::move(ctl)), id_(std::move(id)), next_(std::max<int64_t>(1, from)),
        wake_(std::move(wake)) {}

  batch next(size_t max) override {
    batch b;
    if (serve_backlog(b, max))
      return b;
    auto c = ctl_.lock();
    if (!c) {
      b.final = job_view{};
      b.final->state = ctl_state::lost;
      b.final->status.error = "the controller is shutting down";
      return b;
    }
    std::string journal;
    {
      std::lock_guard lock{c->mu};
      auto e = c->find(id_);
      if (!e) {
        b.final = job_view{};
        return b;
      }
      if (!e->events.empty() && e->events.front().seq <= next_) {
        auto first = e->events.front().seq;
        for (auto i = static_cast<size_t>(next_ - first); i < e->events.size() && b.events.size() < max; ++i)
          b.events.push_back(e->events[i]);
        next_ += static_cast<int64_t>(b.events.size());
        if (!b.events.empty())
          return b;
      }
      if (next_ <= e->rec.last_seq && e->events.empty()) {
        journal = (fs::path{e->rec.run_dir} / "events.jsonl").string();
      } else if (is_final(e->state()) && next_ > e->rec.last_seq) {
        b.final = c->view_of(*e);
        return b;
      } else {
        e->waiters.push_back(wake_);
        return b;
      }
    }
    // The events are no longer in memory (a final job): from its journal.
    load_backlog(journal);
    if (serve_backlog(b, max))
      return b;
    // The journal ends before last_seq (torn): nothing more will come.
    next_ = std::numeric_limits<int64_t>::max();
    return next(max);
  }

private:
  bool serve_backlog(batch& b, size_t max) {
    while (pos_ < backlog_.size() && b.events.size() < max) {
      if (backlog_[pos_].seq >= next_)
        b.events.push_back(std::move(backlog_[pos_])), next_ = b.events.back().seq + 1;
      ++pos_;
    }
    if (pos_ >= backlog_.size())
      std::vector<j::event>{}.swap(backlog_), pos_ = 0;
    return !b.events.empty();
  }

  void load_backlog(const std::string& path) {
    auto text = runtime::read_file(path);
    if (!text)
      return;
    j::each_journal_event(*text, [&](const j::event& ev) {
      if (ev.seq >= next_)
        backlog_.push_back(ev);
    });
    pos_ = 0;
  }

  std::weak_ptr<controller::impl> ctl_;
  std::string id_;
  int64_t next_;
  std::function<void()> wake_;
  std::vector<j::event> backlog_;
  size_t pos_ = 0;
};

} // namespace

expected<std::unique_ptr<event_cursor>> controller::watch(const std::string& id, int64_t from_seq,
                                                          std::function<void()> wake) {
  {
    std::lock_guard lock{impl_->mu};
    if (!impl_->find(id))
      return impl_->unknown(id);
  }
  return std::unique_ptr<event_cursor>{new cursor(impl_, id, from_seq, std::move(wake))};
}

} // namespace troupe::cluster
