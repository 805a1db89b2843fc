#pragma once
/// Numbers as text, for the IR printers.
#include <string>

namespace braze {

/// Shortest text that reads back to the same double ("1.0", "1e-05", "inf", "nan").
std::string formatDouble(double d);

} // namespace braze
