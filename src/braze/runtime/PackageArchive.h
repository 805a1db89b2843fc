#pragma once
/// A package as one file: a zip archive of the package directory (braze.export writes one for
/// a path ending in .zip), its entries stored, not compressed, so that reading it needs no
/// compression library.
#include <string>

namespace braze::runtime {

/// Extracts the package archive at `archivePath` once into a directory under the system's
/// temporary directory named by the archive's SHA-256 (a later load of the same bytes reuses
/// it) and returns that directory, which Package::load then reads and checks as any package.
/// Throws RunError naming what is wrong: not a zip archive, a truncated or damaged one (each
/// entry's CRC-32 is checked), a compressed entry, an entry named outside the package.
std::string extractPackageArchive(const std::string &archivePath);

} // namespace braze::runtime
