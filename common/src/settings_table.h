// The declared settings (settings_table.cc), private to the registry (settings.cc).
#pragma once

#include <span>

#include "loom/common/settings.h"

namespace loom::settings {

std::span<const Setting> table();

}  // namespace loom::settings
