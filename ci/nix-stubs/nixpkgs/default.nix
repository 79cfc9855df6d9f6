# Stand-in for `import nixpkgs { system; overlays; config; }`, for
# ci/nix-eval-check.sh. It holds only what the flake touches, with nixpkgs'
# semantics where the flake depends on them:
#
# - `callPackage` is `lib.callPackageWith pkgs`: every formal argument that
#   names an attribute here is filled from here, defaults included;
# - `stdenv.mkDerivation` returns a real `derivation` (instantiable, never
#   buildable: its builder only fails), with `meta`, `passthru`, outputs with
#   `outputSpecified`, `overrideAttrs` (both `old:` and `final: prev:`
#   forms, `finalAttrs` fixpoint), and the meta checks nixpkgs'
#   check-meta.nix applies when a derivation is instantiated: `drvPath`
#   and `outPath` throw for an unfree licence that neither
#   `config.allowUnfree` nor `config.allowUnfreePredicate` admits, for
#   `meta.broken` without `config.allowBroken`, and for a system outside
#   `meta.platforms` or inside `meta.badPlatforms` without
#   `config.allowUnsupportedSystem`;
# - an attribute set (not a derivation) left in a derivation's arguments is
#   an error, as `builtins.derivation` makes it one, unless the derivation
#   uses `__structuredAttrs` (then the attributes travel as JSON);
# - `cudaPackages_12_{6,8,9}`: redistributable packages under the CUDA EULA
#   (licence as nixpkgs sets it: `nvidiaCudaRedist` with its own `url`),
#   `meta.broken` unless `config.cudaSupport` (nixpkgs' redist builder
#   has that among its brokenAssertions), `__structuredAttrs`; a
#   `cuda_nvrtc` with a `lib` output, and `nccl` built from source with
#   `__structuredAttrs` (so its `makeFlags` reach the derivation as a JSON
#   list, as in nixpkgs) and `NVCC_GENCODE` from `config.cudaCapabilities`
#   (a capability newer than the set's nvcc knows is an error here);
# - `fetchFromGitHub` is a fixed-output derivation: a malformed hash, or both
#   `rev` and `tag`, fails at evaluation;
# - `dockerTools.streamLayeredImage` takes exactly the arguments nixpkgs'
#   does (no `...`), and the image configuration must serialise to JSON.
{
  system ? builtins.currentSystem,
  overlays ? [ ],
  config ? { },
  ...
}:
let
  lib = import ./lib.nix;
  inherit (builtins)
    attrNames
    concatStringsSep
    filter
    isAttrs
    isFunction
    isList
    replaceStrings
    ;

  allowUnfree = config.allowUnfree or false;
  allowUnfreePredicate = config.allowUnfreePredicate or (_: false);
  allowBroken = config.allowBroken or false;
  allowUnsupportedSystem = config.allowUnsupportedSystem or false;
  # nixpkgs' platform entries are system strings or patterns (sets); a
  # pattern is taken as matching.
  platformMatches = ps: builtins.any (p: !(builtins.isString p) || p == system) ps;
  isUnfree = licenses: builtins.any (l: !(l.free or true)) licenses;
  licenseNames = ls: concatStringsSep ", " (map (l: l.shortName or l.spdxId or "?") ls);

  cpuName =
    {
      x86_64-linux = "x86_64";
      aarch64-linux = "aarch64";
    }
    .${system} or (throw "stand-in nixpkgs: system ${system} is not one of the flake's");

  hostPlatform = {
    inherit system;
    isLinux = true;
    parsed.cpu.name = cpuName;
    parsed.kernel.name = "linux";
  };

  # Fails if anyone tries to build it: this is an evaluation stand-in.
  builderArgs = [
    "-c"
    "echo 'stand-in derivation from ci/nix-stubs: evaluation only' >&2; exit 1"
  ];

  fromAttrs =
    attrs:
    let
      name =
        attrs.name
          or "${attrs.pname or (throw "stand-in mkDerivation: neither name nor pname")}-${
            attrs.version or (throw "stand-in mkDerivation: ${attrs.pname} has no version")
          }";
      outputs = attrs.outputs or [ "out" ];
      meta = attrs.meta or { };
      passthru = attrs.passthru or { };
      env = attrs.env or { };
      licenses = if meta ? license then lib.toList meta.license else [ ];
      refused =
        isUnfree licenses
        && !allowUnfree
        && !(allowUnfreePredicate (attrs // { inherit name meta; }));
      unsupported =
        !allowUnsupportedSystem
        && (
          (meta ? platforms && !(platformMatches meta.platforms))
          || platformMatches (builtins.filter builtins.isString (meta.badPlatforms or [ ]))
        );
      valid =
        if refused then
          throw "stand-in nixpkgs: package ‘${name}’ has an unfree licence (${licenseNames licenses}) and config does not allow it, refusing to evaluate"
        else if (meta.broken or false) && !allowBroken then
          throw "stand-in nixpkgs: package ‘${name}’ is marked as broken, refusing to evaluate"
        else if unsupported then
          throw "stand-in nixpkgs: package ‘${name}’ is not available on the requested hostPlatform ${system} (meta.platforms, meta.badPlatforms), refusing to evaluate"
        else
          true;
      structured = attrs.__structuredAttrs or false;
      drvArgs = removeAttrs attrs [
        "meta"
        "passthru"
        "env"
        "pos"
      ];
      sets = filter (
        n: isAttrs drvArgs.${n} && !(drvArgs.${n} ? outPath)
      ) (attrNames drvArgs);
      clash = filter (n: drvArgs ? ${n}) (attrNames env);
      drv =
        if sets != [ ] && !structured then
          throw "stand-in mkDerivation: ${name}: attribute(s) ${concatStringsSep ", " sets} are sets, which a derivation cannot take"
        else if clash != [ ] then
          throw "stand-in mkDerivation: ${name}: env.${builtins.head clash} is also a top-level attribute"
        else
          derivation (
            drvArgs
            // (if structured then lib.optionalAttrs (env != { }) { inherit env; } else env)
            // {
              inherit name system outputs;
              builder = "/bin/sh";
              args = builderArgs;
            }
          );
      common = passthru // {
        inherit meta passthru;
        drvAttrs = drvArgs;
      };
      output =
        o:
        drv.${o}
        // common
        // {
          outputSpecified = true;
          drvPath = assert valid; drv.${o}.drvPath;
          outPath = assert valid; drv.${o}.outPath;
        };
    in
    drv
    // common
    // lib.listToAttrs (map (o: lib.nameValuePair o (output o)) outputs)
    // {
      drvPath = assert valid; drv.drvPath;
      outPath = assert valid; drv.outPath;
    };

  # nixpkgs' extensible attributes: `mkDerivation (finalAttrs: { ... })` and
  # `overrideAttrs` with `old:` or `final: prev:`.
  extensible =
    rattrs:
    fromAttrs (lib.fix rattrs)
    // {
      overrideAttrs =
        f0:
        let
          f =
            final: prev:
            let
              r = f0 prev;
            in
            if isFunction r then f0 final prev else r;
        in
        extensible (
          final:
          let
            prev = rattrs final;
          in
          prev // f final prev
        );
    };

  mkDerivation = a: extensible (if isFunction a then a else (_: a));

  stdenv = {
    inherit mkDerivation hostPlatform;
    buildPlatform = hostPlatform;
    targetPlatform = hostPlatform;
  };

  leaf =
    pname: extra:
    mkDerivation (
      {
        inherit pname;
        version = "0-stand-in";
      }
      // extra
    );

  runCommand =
    name: env: buildCommand:
    mkDerivation (
      {
        inherit name buildCommand;
      }
      // env
    );

  writeText =
    name: text:
    mkDerivation {
      inherit name text;
      passAsFile = [ "text" ];
    };

  fetchFromGitHub =
    {
      owner,
      repo,
      rev ? null,
      tag ? null,
      hash ? null,
      name ? "source",
      ...
    }:
    assert lib.assertMsg (
      (rev == null) != (tag == null)
    ) "stand-in fetchFromGitHub: ${owner}/${repo}: give exactly one of rev and tag";
    assert lib.assertMsg (hash != null) "stand-in fetchFromGitHub: ${owner}/${repo}: no hash";
    derivation {
      inherit name system;
      builder = "/bin/sh";
      args = builderArgs;
      url = "https://github.com/${owner}/${repo}/archive/${if tag != null then "refs/tags/${tag}" else rev}.tar.gz";
      outputHashMode = "recursive";
      outputHash = hash;
    }
    // {
      inherit owner repo rev tag;
    };

  # CUDA package sets: what the flake reads of them.
  # Newest capability each set's nvcc can compile for (NVIDIA's release
  # notes: CUDA 12.8 added sm_100 and sm_120).
  newestCapability = {
    "12.6" = "9.0";
    "12.8" = "12.0";
    "12.9" = "12.1";
  };
  mkCudaSet =
    mm:
    let
      prefix = "cuda${mm}";
      capabilities =
        config.cudaCapabilities or [
          "7.5"
          "8.0"
          "8.6"
          "8.9"
          "9.0"
        ];
      tooNew = filter (c: builtins.compareVersions c newestCapability.${mm} > 0) capabilities;
      forwardCompat = config.cudaForwardCompat or true;
      dropDot = replaceStrings [ "." ] [ "" ];
      last = builtins.elemAt capabilities (builtins.length capabilities - 1);
      gencode =
        if tooNew != [ ] then
          throw "stand-in cudaPackages_${dropDot mm}: CUDA ${mm} cannot compile for capability ${builtins.head tooNew}"
        else
          map (c: "-gencode=arch=compute_${dropDot c},code=sm_${dropDot c}") capabilities
          ++ lib.optional forwardCompat "-gencode=arch=compute_${dropDot last},code=compute_${dropDot last}";
      redist =
        pname: outputs:
        mkDerivation {
          name = "${prefix}-${pname}-${mm}.0";
          inherit pname outputs;
          version = "${mm}.0";
          __structuredAttrs = true;
          strictDeps = true;
          meta = {
            license = lib.licenses.nvidiaCudaRedist // {
              url = "https://developer.download.nvidia.com/compute/cuda/redist/${pname}/LICENSE.txt";
            };
            # nixpkgs' redist builder: the first of its brokenAssertions.
            broken = !(config.cudaSupport or false);
            platforms = [
              "x86_64-linux"
              "aarch64-linux"
            ];
            badPlatforms = [ ];
          };
        };
      self = {
        cudaMajorMinorVersion = mm;
        cudaMajorVersion = builtins.head (builtins.splitVersion mm);
        cudaNamePrefix = prefix;
        flags = {
          cudaCapabilities = capabilities;
          gencodeString = concatStringsSep " " gencode;
        };
        backendStdenv = stdenv;
        cuda_nvrtc = redist "cuda_nvrtc" [
          "out"
          "lib"
          "dev"
          "static"
        ];
        cuda_nvcc = redist "cuda_nvcc" [
          "out"
          "bin"
          "dev"
        ];
        cuda_cudart = redist "cuda_cudart" [
          "out"
          "lib"
          "dev"
        ];
        cuda_cccl = redist "cuda_cccl" [
          "out"
          "dev"
        ];
        # As nixpkgs builds it: from source, name prefixed by the set, the
        # version read through finalAttrs (an override of `version` renames
        # it), architectures from the set's flags.
        nccl = mkDerivation (finalAttrs: {
          pname = "nccl";
          version = "2.28.7-1";
          name = "${prefix}-${finalAttrs.pname}-${finalAttrs.version}";
          src = fetchFromGitHub {
            owner = "NVIDIA";
            repo = "nccl";
            tag = "v${finalAttrs.version}";
            hash = "sha256-NM19OiBBGmv3cGoVoRLKSh9Y59hiDoei9NIrRnTqWeA=";
          };
          __structuredAttrs = true;
          strictDeps = true;
          outputs = [
            "out"
            "dev"
          ];
          nativeBuildInputs = [
            self.cuda_nvcc
            pkgs.python3
            pkgs.which
          ];
          buildInputs = [
            self.cuda_cudart
            self.cuda_cccl
          ];
          makeFlags = [
            "PREFIX=$(out)"
            "NVCC_GENCODE=${self.flags.gencodeString}"
          ];
          meta = {
            license = lib.licenses.bsd3;
            platforms = lib.platforms.linux;
          };
        });
      };
    in
    self;

  base = final: {
    inherit
      lib
      config
      system
      stdenv
      runCommand
      writeText
      fetchFromGitHub
      ;
    stdenvNoCC = stdenv;
    callPackage = lib.callPackageWith final;
    writeTextDir =
      path: text:
      mkDerivation {
        name = baseNameOf path;
        inherit path text;
        passAsFile = [ "text" ];
      };
    makeBinaryWrapper = leaf "make-binary-wrapper-hook" { };
    makeWrapper = leaf "make-shell-wrapper-hook" { };
    addDriverRunpath = leaf "add-driver-runpath" { } // {
      driverLink = "/run/opengl-driver";
    };
    mkShell =
      {
        packages ? [ ],
        inputsFrom ? [ ],
        shellHook ? "",
        ...
      }@args:
      mkDerivation (
        removeAttrs args [
          "packages"
          "inputsFrom"
        ]
        // {
          name = args.name or "nix-shell";
          nativeBuildInputs = packages;
          inherit shellHook;
        }
      );
    makeRustPlatform =
      { cargo, rustc }:
      {
        buildRustPackage =
          args:
          let
            sources = filter (n: args ? ${n}) [
              "cargoLock"
              "cargoHash"
              "cargoDeps"
              "cargoVendorDir"
            ];
            lock = builtins.fromTOML (builtins.readFile args.cargoLock.lockFile);
            gitDeps = filter (p: lib.hasPrefix "git+" (p.source or "")) (lock.package or [ ]);
          in
          assert lib.assertMsg (
            builtins.length sources == 1
          ) "stand-in buildRustPackage: give exactly one of cargoLock, cargoHash, cargoDeps, cargoVendorDir";
          assert lib.assertMsg (
            !(args ? cargoLock) || builtins.pathExists args.cargoLock.lockFile
          ) "stand-in buildRustPackage: cargoLock.lockFile does not exist";
          assert lib.assertMsg (
            !(args ? cargoLock) || gitDeps == [ ] || args.cargoLock ? outputHashes
          ) "stand-in buildRustPackage: git dependencies need cargoLock.outputHashes";
          mkDerivation (
            removeAttrs args [
              "cargoLock"
              "cargoHash"
              "auditable"
            ]
            // {
              nativeBuildInputs = [
                cargo
                rustc
              ]
              ++ args.nativeBuildInputs or [ ];
              cargoDeps = leaf "${args.pname}-vendor" { };
              auditable = args.auditable or true;
            }
          );
      };
    dockerTools.streamLayeredImage =
      {
        name,
        tag ? null,
        fromImage ? null,
        contents ? [ ],
        config ? { },
        architecture ? null,
        created ? "1970-01-01T00:00:01Z",
        uid ? 0,
        gid ? 0,
        uname ? "root",
        gname ? "root",
        maxLayers ? 100,
        extraCommands ? "",
        fakeRootCommands ? "",
        enableFakechroot ? false,
        includeStorePaths ? true,
        includeNixDB ? false,
        passthru ? { },
        meta ? { },
      }:
      runCommand "stream-${name}" {
        inherit fakeRootCommands extraCommands;
        imageName = name;
        imageTag = if tag == null then "latest" else tag;
        contents = lib.toList contents;
        conf = builtins.toJSON config;
        passAsFile = [ "conf" ];
        inherit passthru meta;
      } "exit 1";

    python3 = leaf "python3" { };
    which = leaf "which" { };
    jq = leaf "jq" { meta.mainProgram = "jq"; };
    coreutils = leaf "coreutils" { };
    bash = leaf "bash" { };
    shellcheck = leaf "shellcheck" { };
    actionlint = leaf "actionlint" { };
    hadolint = leaf "hadolint" { };
    cargo-nextest = leaf "cargo-nextest" { };
    cargo-deny = leaf "cargo-deny" { };
    cargo-audit = leaf "cargo-audit" { };
    # nixpkgs' own Rust tools: the names a formal argument can collide with
    # (a `rustPlatform` argument nobody passes gets this one, silently).
    clippy = leaf "clippy" { };
    rustc = leaf "rustc" { };
    cargo = leaf "cargo" { };
    rustfmt = leaf "rustfmt" { };
    rustPlatform = final.makeRustPlatform {
      inherit (final) cargo rustc;
    };

    cudaPackages_12_6 = mkCudaSet "12.6";
    cudaPackages_12_8 = mkCudaSet "12.8";
    cudaPackages_12_9 = mkCudaSet "12.9";
    cudaPackages = final.cudaPackages_12_8;
  };

  pkgs = lib.fix (final: builtins.foldl' (prev: overlay: prev // overlay final prev) (base final) overlays);
in
assert lib.assertMsg (isList overlays) "stand-in nixpkgs: overlays must be a list";
pkgs
