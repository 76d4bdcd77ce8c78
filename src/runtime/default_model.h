// The model used when a front end (CLI, Python) is given none.
#pragma once

#include <filesystem>

namespace di {

std::filesystem::path default_model_dir();

}  // namespace di
