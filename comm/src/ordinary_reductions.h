// A scope in which this thread's collectives reduce the ordinary way, whatever
// CollectiveOptions::reproducible and ContextOptions::reproducible say: the reproducible mode's
// two-rank path runs the ordinary SUM inside it (reproducible.cc), where one IEEE addition per
// element is the answer. Scopes nest; each restores what it found.
#pragma once

namespace loom::comm {

class OrdinaryReductions {
 public:
  OrdinaryReductions();
  ~OrdinaryReductions();
  OrdinaryReductions(const OrdinaryReductions&) = delete;
  OrdinaryReductions& operator=(const OrdinaryReductions&) = delete;

  // Whether this thread is inside such a scope.
  static bool active();

 private:
  bool previous_;
};

}  // namespace loom::comm
