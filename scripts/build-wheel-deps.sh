#!/usr/bin/env bash
# Build the C libraries the wheel links, from Debian's source packages, with zig as the
# C/C++ compiler targeting glibc 2.28, as static PIC archives:
#   scripts/build-wheel-deps.sh            prints the prefix (builds it first if absent)
# The prefix, ~/.cache/speedmatrix/wheel-deps-<versions>/ (or $SPEEDMATRIX_WHEEL_DEPS_CACHE/...),
# is kept between runs: the key names every version that goes into it, so a change of
# version builds a new one and an unchanged one is reused (CI caches the folder).
# It holds:
#   bin/zig-cc, bin/zig-c++   the compilers (zig from PyPI's `ziglang`, -target x86_64-linux-gnu.2.28)
#   toolchain.cmake           selects them and keeps CMake's package search inside the prefix
#   lib/*.a, include/, lib/cmake, lib/pkgconfig
#       libcurl (HTTP(S) only, TLS by mbedTLS, CAs: /etc/ssl/certs, see README "Install"),
#       mbedTLS, libevent (core, extra, pthreads), simdjson; nlohmann/json headers.
# Why static: the wheel's extension and engine then carry them inside themselves, and what
# they still need from the system is glibc <= 2.28 (zig links against 2.28's symbol
# versions) and nothing from libstdc++ (zig links LLVM's libc++ statically).
# Sources: `apt-get source` of Debian bookworm's packages (their patches applied), through
# a private apt state under the cache (the system's apt configuration is not touched).
# Needs: python3 with pip (for ziglang), dpkg-source, cmake, make, PyPI and Debian's archive.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
ZIG_VERSION=0.17.1
GLIBC=2.28
CURL=7.88.1-10+deb12u15
MBEDTLS=2.28.3-1
LIBEVENT=2.1.12-stable-8+deb12u1
SIMDJSON=3.0.1-1
NLOHMANN=3.11.2-2
KEY="zig${ZIG_VERSION}-glibc${GLIBC}-curl${CURL}-mbedtls${MBEDTLS}-libevent${LIBEVENT}-simdjson${SIMDJSON}-json${NLOHMANN}-r2"
CACHE="${SPEEDMATRIX_WHEEL_DEPS_CACHE:-$HOME/.cache/speedmatrix}"
PREFIX="$CACHE/wheel-deps-$KEY"
JOBS="${JOBS:-2}"

if [[ -f "$PREFIX/.complete" ]]; then
  echo "$PREFIX"
  exit 0
fi
exec 3>&1 1>&2 # progress to stderr; the prefix alone to stdout
rm -rf "$PREFIX" && mkdir -p "$PREFIX/bin" "$PREFIX/src"
SRC="$PREFIX/src"

echo "== zig $ZIG_VERSION (PyPI: ziglang)"
"$PY" -m venv "$PREFIX/zig"
"$PREFIX/zig/bin/pip" install --quiet "ziglang==$ZIG_VERSION"
for tool in cc c++; do
  cat >"$PREFIX/bin/zig-$tool" <<EOF
#!/bin/sh
exec "$PREFIX/zig/bin/python" -m ziglang $tool -target x86_64-linux-gnu.$GLIBC "\$@"
EOF
  chmod +x "$PREFIX/bin/zig-$tool"
done
cat >"$PREFIX/toolchain.cmake" <<EOF
set(CMAKE_C_COMPILER "$PREFIX/bin/zig-cc")
set(CMAKE_CXX_COMPILER "$PREFIX/bin/zig-c++")
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
# Search the prefix first and never the host's /usr: its headers and libraries are glibc 2.36's.
list(PREPEND CMAKE_PREFIX_PATH "$PREFIX")
set(CMAKE_IGNORE_PREFIX_PATH /usr /usr/local)
set(ENV{PKG_CONFIG_LIBDIR} "$PREFIX/lib/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# pybind11 would add -flto, which zig's linker does not take for every object here.
set(CMAKE_INTERPROCEDURAL_OPTIMIZATION OFF)
EOF

echo "== sources (Debian bookworm, apt-get source)"
APT="$CACHE/apt-src"
mkdir -p "$APT/parts" "$APT/lists/partial" "$APT/cache"
: >"$APT/none.list"
sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$APT/parts/src.sources"
AOPT=(-o "Dir::Etc::SourceList=$APT/none.list" -o "Dir::Etc::SourceParts=$APT/parts"
  -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o APT::Sandbox::User=root)
apt-get "${AOPT[@]}" update -qq
(cd "$SRC" && apt-get "${AOPT[@]}" source -qq --download-only \
  "curl=$CURL" "mbedtls=$MBEDTLS" "libevent=$LIBEVENT" "simdjson=$SIMDJSON" "nlohmann-json3=$NLOHMANN")
for dsc in "$SRC"/*.dsc; do
  name=$(basename "$dsc" .dsc)
  dpkg-source --no-check -x "$dsc" "$SRC/${name%%_*}" >/dev/null
done

export CC="$PREFIX/bin/zig-cc" CXX="$PREFIX/bin/zig-c++"
export CFLAGS="-O2 -fPIC" CXXFLAGS="-O2 -fPIC"
CM=(-G "Unix Makefiles" -DCMAKE_TOOLCHAIN_FILE="$PREFIX/toolchain.cmake" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=OFF
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5) # the 2020-era CMakeLists of these packages
build() { # build DIR [cmake options...]
  local dir=$1
  shift
  cmake -S "$SRC/$dir" -B "$SRC/$dir/_build" "${CM[@]}" "$@" >/dev/null
  nice -n 10 cmake --build "$SRC/$dir/_build" -j"$JOBS" >/dev/null
  cmake --install "$SRC/$dir/_build" >/dev/null
}

echo "== nlohmann/json (headers)"
build nlohmann-json3 -DJSON_BuildTests=OFF -DJSON_Install=ON
echo "== simdjson"
build simdjson -DSIMDJSON_DEVELOPER_MODE=OFF -DSIMDJSON_ENABLE_THREADS=ON
echo "== libevent"
build libevent -DEVENT__LIBRARY_TYPE=STATIC -DEVENT__DISABLE_OPENSSL=ON -DEVENT__DISABLE_MBEDTLS=ON \
  -DEVENT__DISABLE_BENCHMARK=ON -DEVENT__DISABLE_TESTS=ON -DEVENT__DISABLE_REGRESS=ON \
  -DEVENT__DISABLE_SAMPLES=ON -DEVENT__DISABLE_DEBUG_MODE=ON
echo "== mbedTLS"
build mbedtls -DENABLE_TESTING=OFF -DENABLE_PROGRAMS=OFF -DUSE_SHARED_MBEDTLS_LIBRARY=OFF \
  -DUSE_STATIC_MBEDTLS_LIBRARY=ON -DMBEDTLS_FATAL_WARNINGS=OFF
echo "== libcurl (HTTP and HTTPS only)"
# Trusted CAs: every certificate file in /etc/ssl/certs, and no single default bundle file,
# because there is no file name all targets share (Debian/Ubuntu: ca-certificates.crt; RHEL:
# ca-bundle.crt, reached through /etc/ssl/certs -> /etc/pki/tls/certs) and with mbedTLS a
# missing default bundle fails every HTTPS request. The folder holds both.
build curl -DBUILD_CURL_EXE=OFF -DBUILD_TESTING=OFF -DCURL_USE_MBEDTLS=ON -DCURL_USE_OPENSSL=OFF \
  -DHTTP_ONLY=ON -DCURL_DISABLE_LDAP=ON -DUSE_LIBIDN2=OFF -DUSE_NGHTTP2=OFF -DCURL_USE_LIBSSH2=OFF \
  -DCURL_USE_LIBPSL=OFF -DCURL_ZLIB=OFF -DCURL_BROTLI=OFF -DCURL_ZSTD=OFF -DENABLE_UNIX_SOCKETS=ON \
  -DCURL_CA_BUNDLE=none -DCURL_CA_PATH=/etc/ssl/certs \
  -DMBEDTLS_INCLUDE_DIRS="$PREFIX/include" -DMBEDTLS_LIBRARY="$PREFIX/lib/libmbedtls.a" \
  -DMBEDX509_LIBRARY="$PREFIX/lib/libmbedx509.a" -DMBEDCRYPTO_LIBRARY="$PREFIX/lib/libmbedcrypto.a"

rm -rf "$SRC"
touch "$PREFIX/.complete"
echo "$PREFIX" >&3
