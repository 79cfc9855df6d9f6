# Stand-in for the part of nixpkgs' `lib` that the flake uses, written for
# ci/nix-eval-check.sh (Debian's Nix 2.8 cannot evaluate real nixpkgs, and
# it cannot be fetched there). Where the flake depends on a behaviour, the
# behaviour is nixpkgs' own: above all `callPackageWith`, which fills EVERY
# formal argument that names an attribute of the package set, defaults or
# not, and `optionalAttrs`, which demands a Boolean. Functions the flake does
# not call are left out, so a new use fails here first ("attribute missing")
# and gets a stand-in written for it on purpose.
let
  inherit (builtins)
    all
    any
    attrNames
    concatLists
    concatMap
    elem
    filter
    foldl'
    functionArgs
    genList
    head
    isAttrs
    isFunction
    isList
    isPath
    isString
    length
    listToAttrs
    mapAttrs
    pathExists
    stringLength
    substring
    ;

  fix =
    f:
    let
      x = f x;
    in
    x;

  toList = x: if isList x then x else [ x ];

  nameValuePair = name: value: { inherit name value; };

  hasPrefix = pre: s: substring 0 (stringLength pre) s == pre;

  unique = foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ];

  # Like nixpkgs: the override keeps working on what overrideAttrs returns.
  makeOverridable =
    f: args:
    let
      result = f args;
      overrideWith = newArgs: args // (if isFunction newArgs then newArgs args else newArgs);
      keep = r: if isAttrs r then addOverride r else r;
      addOverride =
        r:
        r
        // {
          override = newArgs: makeOverridable f (overrideWith newArgs);
        }
        // (if r ? overrideAttrs then { overrideAttrs = g: keep (r.overrideAttrs g); } else { });
    in
    keep result;

  # nixpkgs' semantics: every formal the package set provides is passed,
  # including formals with a default; explicit arguments win; a required
  # formal nobody provides is an error naming it.
  callPackageWith =
    autoArgs: fn: args:
    let
      f = if isFunction fn then fn else import fn;
      fargs = functionArgs f;
      allArgs = builtins.intersectAttrs fargs autoArgs // args;
      missing = filter (n: !fargs.${n} && !(allArgs ? ${n})) (attrNames fargs);
    in
    if missing != [ ] then
      throw "stand-in callPackageWith: function called without required argument(s) ${builtins.concatStringsSep ", " missing}"
    else
      makeOverridable f allArgs;

  getOutput =
    output: pkg:
    if !(pkg ? outputSpecified) || !pkg.outputSpecified then pkg.${output} or pkg.out or pkg else pkg;

  getName = x: x.pname or (builtins.parseDrvName x.name).name;

  getExe =
    x:
    let
      prog =
        x.meta.mainProgram
          or (throw "stand-in getExe: ${x.name or "package"} has no meta.mainProgram (nixpkgs warns and guesses)");
    in
    "${getOutput "bin" x}/bin/${prog}";

  licenses = {
    mit = {
      spdxId = "MIT";
      shortName = "mit";
      fullName = "MIT License";
      free = true;
    };
    asl20 = {
      spdxId = "Apache-2.0";
      shortName = "asl20";
      fullName = "Apache License 2.0";
      free = true;
    };
    bsd3 = {
      spdxId = "BSD-3-Clause";
      shortName = "bsd3";
      fullName = "BSD 3-clause \"New\" or \"Revised\" License";
      free = true;
    };
    # As nixpkgs' lib/licenses.nix: both CUDA licences share the short name;
    # neither has an SPDX id.
    nvidiaCuda = {
      shortName = "CUDA EULA";
      fullName = "CUDA Toolkit End User License Agreement (EULA)";
      url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement";
      free = false;
    };
    nvidiaCudaRedist = {
      shortName = "CUDA EULA";
      fullName = "CUDA Toolkit End User License Agreement (EULA)";
      url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement";
      free = false;
      redistributable = true;
    };
    unfree = {
      shortName = "unfree";
      fullName = "Unfree";
      free = false;
    };
  };

  # --- lib.fileset, reduced: a set of included and excluded paths --------------
  isFileset = x: isAttrs x && (x._type or null) == "fileset";
  coerce =
    what: x:
    if isFileset x then
      x
    else if isPath x then
      if pathExists x then
        {
          _type = "fileset";
          include = [ (toString x) ];
          exclude = [ ];
        }
      else
        throw "stand-in lib.fileset.${what}: ${toString x} does not exist (lib.fileset.maybeMissing allows that)"
    else if isString x then
      throw "stand-in lib.fileset.${what}: ${x} is a string; lib.fileset takes paths"
    else
      throw "stand-in lib.fileset.${what}: expected a path or a file set";
  empty = {
    _type = "fileset";
    include = [ ];
    exclude = [ ];
  };
  under = dir: p: p == dir || hasPrefix "${dir}/" p;
  fileset = {
    maybeMissing = p: if pathExists p then coerce "maybeMissing" p else empty;
    unions =
      list:
      let
        sets = map (coerce "unions") list;
      in
      {
        _type = "fileset";
        include = concatMap (s: s.include) sets;
        exclude = concatMap (s: s.exclude) sets;
      };
    difference =
      a: b:
      let
        sa = coerce "difference" a;
        sb = coerce "difference" b;
      in
      sa // { exclude = sa.exclude ++ sb.include; };
    toSource =
      { root, fileset }:
      let
        set = coerce "toSource" fileset;
        r = toString root;
        outside = filter (p: !(under r p)) set.include;
        keep =
          p: _type:
          !(any (e: under e p) set.exclude)
          && any (i: under i p || hasPrefix "${p}/" i) set.include;
      in
      if !(isPath root) then
        throw "stand-in lib.fileset.toSource: root must be a path"
      else if outside != [ ] then
        throw "stand-in lib.fileset.toSource: ${head outside} is not under the root ${r}"
      else
        builtins.path {
          path = root;
          name = "source";
          filter = keep;
        };
  };
in
{
  inherit
    all
    any
    attrNames
    callPackageWith
    concatLists
    concatMap
    elem
    filter
    fileset
    fix
    foldl'
    genList
    getExe
    getName
    getOutput
    hasPrefix
    head
    length
    licenses
    listToAttrs
    makeOverridable
    mapAttrs
    nameValuePair
    toList
    unique
    ;
  attrValues = builtins.attrValues;
  concatStringsSep = builtins.concatStringsSep;
  getLib = getOutput "lib";
  getDev = getOutput "dev";
  getBin = getOutput "bin";
  genAttrs = names: f: listToAttrs (map (n: nameValuePair n (f n)) names);
  mapAttrsToList = f: set: map (n: f n set.${n}) (attrNames set);
  concatMapAttrs = f: set: foldl' (acc: n: acc // f n set.${n}) { } (attrNames set);
  filterAttrs =
    pred: set:
    listToAttrs (
      concatMap (n: if pred n set.${n} then [ (nameValuePair n set.${n}) ] else [ ]) (attrNames set)
    );
  optional = cond: x: if cond then [ x ] else [ ];
  optionals = cond: xs: if cond then xs else [ ];
  optionalString = cond: s: if cond then s else "";
  # `if` demands a Boolean: a package passed as `cond` fails as in nixpkgs.
  optionalAttrs = cond: set: if cond then set else { };
  assertMsg = pred: msg: pred || throw msg;
  importTOML = p: builtins.fromTOML (builtins.readFile p);
  importJSON = p: builtins.fromJSON (builtins.readFile p);
  versionAtLeast = a: b: builtins.compareVersions a b >= 0;
  versionOlder = a: b: builtins.compareVersions a b < 0;
  replaceStrings = builtins.replaceStrings;
  fakeHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
  platforms = {
    linux = [
      "x86_64-linux"
      "aarch64-linux"
    ];
  };
}
