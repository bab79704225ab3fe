# Every stack's pins, read from locks/<stack>.lock with builtins.fromJSON: the lock files are the
# one source of truth, nothing here repeats a version. Stacks are discovered from the lock files
# present; stacks/*.toml without a lock (or a lock without its stack file) is an error naming it.
# builtins only: this evaluates offline, with no nixpkgs.
{ root }:
let
  u = import ./util.nix;
  inherit (u) fail hasPrefix hasSuffix removeSuffix;

  LOCK_SCHEMA = "speclock.lock/v1";

  namesIn = dir: suffix:
    if builtins.pathExists dir then
      let entries = builtins.readDir dir;
      in map (removeSuffix suffix)
        (builtins.filter (n: entries.${n} == "regular" && hasSuffix suffix n && !(hasPrefix "." n))
          (builtins.attrNames entries))
    else [ ];

  lockNames = namesIn (root + "/locks") ".lock";
  stackNames = namesIn (root + "/stacks") ".toml";
  stacksWithoutLock = builtins.filter (n: !(builtins.elem n lockNames)) stackNames;
  locksWithoutStack = builtins.filter (n: !(builtins.elem n stackNames)) lockNames;

  redo = name: "re-create it with `invoke lock --stack ${name}`";

  # JSON parse errors from fromJSON do not name the file, so the common ways a lock becomes
  # unreadable (empty, truncated, merge conflict, not JSON at all) are caught first by name.
  readLockText = name:
    let
      file = "locks/${name}.lock";
      text = builtins.readFile (root + "/locks/${name}.lock");
      stripped = u.splitOn "[[:space:]]+$" text;
      body = if stripped == [ ] then "" else builtins.head stripped;
      len = builtins.stringLength body;
    in
    if len == 0 then fail "stack ${name}: ${file} is empty; ${redo name}"
    else if builtins.length (builtins.split "(^|\n)(<<<<<<<|>>>>>>>) " text) > 1
    then fail "stack ${name}: ${file} has merge conflict markers; ${redo name} (never merge locks by hand)"
    else if builtins.substring 0 1 body != "{"
    then fail "stack ${name}: ${file} is not a JSON object (it must start with '{'); ${redo name}"
    else if builtins.substring (len - 1) 1 body != "}"
    then fail "stack ${name}: ${file} is truncated (it must end with '}'); ${redo name}"
    else
      let syntax = import ./json.nix text;
      in if syntax != null
      then fail "stack ${name}: ${file} is not valid JSON at line ${toString syntax.line}: ${syntax.problem}; ${redo name}"
      else builtins.fromJSON text;

  need = name: where: doc: key:
    if builtins.isAttrs doc && doc ? ${key} then doc.${key}
    else fail "stack ${name}: locks/${name}.lock: key '${where}${key}' is missing; ${redo name}";

  needString = name: where: doc: key:
    let v = need name where doc key;
    in if builtins.isString v then v
    else fail "stack ${name}: locks/${name}.lock: key '${where}${key}' must be a string; ${redo name}";

  needList = name: where: doc: key:
    let v = need name where doc key;
    in if builtins.isList v then v
    else fail "stack ${name}: locks/${name}.lock: key '${where}${key}' must be a list; ${redo name}";

  wheel = name: section: i: p:
    let
      where = "${section}[${toString i}].";
      str = key:
        let v = needString name where p key;
        in if v == "" then fail "stack ${name}: locks/${name}.lock: key '${where}${key}' is empty; ${redo name}" else v;
      pname = str "name";
      sha256 = str "sha256";
      filename = str "filename";
      url = str "url";
    in
    if builtins.match "[0-9a-f]{64}" sha256 == null
    then fail "stack ${name}: locks/${name}.lock: key '${section}[${toString i}].sha256' (${pname}) is not 64 hex digits; ${redo name}"
    else if !(hasSuffix ".whl" filename)
    then fail "stack ${name}: locks/${name}.lock: key '${section}[${toString i}].filename' (${pname}) is not a wheel: ${filename}"
    else {
      name = pname;
      version = str "version";
      inherit filename url sha256;
      # Every committed lock names an index's URL (PyPI, or download.pytorch.org for torch+cpu);
      # `speclock lock --check` refuses file:// URLs, so `local` only marks older or hand-made locks,
      # fetchable where that folder exists or from the Nix store (`nix store add-file`).
      fromPyPI = hasPrefix "https://files.pythonhosted.org/" url;
      local = hasPrefix "file://" url;
    };

  wheels = name: doc: section: builtins.genList (i: wheel name section i (builtins.elemAt (needList name "" doc section) i))
    (builtins.length (needList name "" doc section));

  readStack = name:
    let
      doc = readLockText name;
      file = "locks/${name}.lock";
      schema = need name "" doc "schema";
      data = need name "" doc "stack_data";
      sect = key: need name "stack_data." data key;
      engine = sect "engine";
      torch = sect "torch";
      gpu = sect "gpu";
      python = sect "python";
      patches = sect "patches";
      pkgs = wheels name doc "packages";
      assets = wheels name doc "assets";
      epoch = need name "" doc "source_date_epoch";
    in
    if schema != LOCK_SCHEMA then fail "stack ${name}: ${file}: key 'schema' is ${builtins.toJSON schema}, expected \"${LOCK_SCHEMA}\"; ${redo name}"
    else if need name "" doc "stack" != name then fail "stack ${name}: ${file}: key 'stack' is ${builtins.toJSON doc.stack}, but the file is named for ${name}; ${redo name}"
    else if !(builtins.isInt epoch) then fail "stack ${name}: ${file}: key 'source_date_epoch' must be an integer; ${redo name}"
    else {
      inherit name;
      lockFile = file;
      stackFile = "stacks/${name}.toml";
      lockSha256 = needString name "" doc "lock_sha256";
      stackSha256 = needString name "" doc "stack_sha256";
      sourceDateEpoch = epoch;
      description = data.description or "";
      engine = {
        name = needString name "stack_data.engine." engine "name";
        package = needString name "stack_data.engine." engine "package";
        version = needString name "stack_data.engine." engine "version";
        settings = engine.settings or { };
      };
      torch = {
        version = needString name "stack_data.torch." torch "version";
        index = torch.index or "";
      };
      cuda = needString name "stack_data.gpu." gpu "cuda";
      archs = needList name "stack_data.gpu." gpu "archs";
      knownGaps = gpu.known_gaps or [ ];
      patches = needList name "stack_data.patches." patches "series";
      python = rec {
        version = needString name "stack_data.python." python "version";
        nixAttr = "python" + builtins.replaceStrings [ "." ] [ "" ] version;
        platforms = (need name "" doc "python").platforms or [ ];
      };
      base = need name "" doc "base";
      target = data.target or { };
      draft = data.draft or { };
      smoke = data.smoke or { };
      wheels = pkgs;
      wheelsByName = u.listToAttrsBy "name" pkgs;
      assets = assets;
      excluded = map (p: p.name) (doc.excluded or [ ]);
      # [prune] as the lock records it (docs/prune.md); pruned packages are not in `packages`.
      prune = doc.prune or { packages = [ ]; paths = [ ]; };
      counts = {
        wheels = builtins.length pkgs;
        fromPyPI = builtins.length (builtins.filter (w: w.fromPyPI) pkgs);
        local = builtins.length (builtins.filter (w: w.local) pkgs);
      };
    };

  stacks = builtins.listToAttrs (map (n: { name = n; value = readStack n; }) lockNames);

  # ---- consistency, all offline -----------------------------------------------------------
  # Keys whose value in stacks/<name>.toml must equal what the lock was resolved from.
  syncedKeys = [
    [ "engine" "name" ] [ "engine" "package" ] [ "engine" "version" ]
    [ "torch" "version" ] [ "torch" "index" ]
    [ "gpu" "cuda" ] [ "gpu" "archs" ]
    [ "patches" "series" ]
    [ "python" "version" ]
    [ "base" "kind" ] [ "base" "suite" ]
  ];

  consistency = name:
    let
      s = stacks.${name};
      toml = builtins.fromTOML (builtins.readFile (root + "/stacks/${name}.toml"));
      lockData = (readLockText name).stack_data;
      keyProblem = path:
        let
          sec = builtins.elemAt path 0;
          key = builtins.elemAt path 1;
        in
        if toml ? ${sec} && toml.${sec} ? ${key} && (lockData.${sec}.${key} or null) != toml.${sec}.${key}
        then [ "stack ${name}: stacks/${name}.toml says ${sec}.${key} = ${builtins.toJSON toml.${sec}.${key}}, but locks/${name}.lock was made from ${builtins.toJSON (lockData.${sec}.${key} or null)}; run `invoke lock --stack ${name}`" ]
        else [ ];
      pinned = pkg: version:
        let w = s.wheelsByName.${u.normalizeName pkg} or null;
        in if w == null then [ "stack ${name}: locks/${name}.lock has no wheel for ${pkg} (key packages); run `invoke lock --stack ${name}`" ]
        else if w.version != version then [ "stack ${name}: locks/${name}.lock pins ${pkg} ${w.version}, but key ${if pkg == "torch" then "torch" else "engine"}.version says ${version}; run `invoke lock --stack ${name}`" ]
        else [ ];
      patchProblems = builtins.concatMap
        (p: if builtins.pathExists (root + "/patches/${s.engine.name}/${p}") then [ ]
        else [ "stack ${name}: key patches.series names ${p}, which is not in patches/${s.engine.name}/ (or not git-tracked)" ])
        s.patches;
      archProblems = (if s.archs != [ ] && s.cuda == "" then [ "stack ${name}: key gpu.archs is set but gpu.cuda is empty" ] else [ ])
        ++ builtins.concatMap (a: if builtins.match "sm_[0-9]+[0-9][af]?" a == null then [ "stack ${name}: key gpu.archs has ${builtins.toJSON a}; expected sm_NN, sm_NNa or sm_NNf" ] else [ ]) s.archs
        ++ (if s.cuda != "" && builtins.match "[0-9]+\\.[0-9]+" s.cuda == null then [ "stack ${name}: key gpu.cuda is ${builtins.toJSON s.cuda}; expected MAJOR.MINOR, e.g. 12.8" ] else [ ]);
      lockPython = (readLockText name).python.version or null;
      pythonProblems = if lockPython != s.python.version then [ "stack ${name}: locks/${name}.lock key python.version is ${builtins.toJSON lockPython}, stack_data says ${s.python.version}" ] else [ ];
    in
    (if toml.name or name != name then [ "stack ${name}: stacks/${name}.toml key name is ${builtins.toJSON toml.name}; it must equal the file name" ] else [ ])
    ++ builtins.concatMap keyProblem syncedKeys
    ++ pinned s.engine.package s.engine.version
    ++ (if s.torch.version != "" then pinned "torch" s.torch.version else [ ])
    ++ patchProblems ++ archProblems ++ pythonProblems;

  coverageProblems =
    map (n: "stack ${n}: stacks/${n}.toml has no locks/${n}.lock, so the flake cannot provide it; run `invoke lock --stack ${n}` and git add the lock") stacksWithoutLock
    ++ map (n: "stack ${n}: locks/${n}.lock has no stacks/${n}.toml; remove the lock or restore the stack file") locksWithoutStack;

  # Throws with every problem listed, or returns `value`.
  require = problems: value:
    if problems == [ ] then value else fail (builtins.concatStringsSep "\n  " ([ "pin check failed:" ] ++ problems));
in
{
  inherit stacks stackNames lockNames stacksWithoutLock locksWithoutStack coverageProblems;
  names = lockNames;
  # Validated pins of one stack: throws naming the stack and key when they disagree.
  # Every stack the repository declares or locks (a stack file without a lock throws when used).
  allNames = lockNames ++ stacksWithoutLock;
  checked = name:
    if builtins.elem name stacksWithoutLock then
      fail "stack ${name}: stacks/${name}.toml has no locks/${name}.lock, so the flake cannot provide it; run `invoke lock --stack ${name}` and git add the lock"
    else if !(builtins.elem name lockNames) then
      fail "stack ${name}: no locks/${name}.lock in the flake (known: ${builtins.concatStringsSep ", " lockNames}); run `invoke lock --stack ${name}` and git add it"
    else require (consistency name) (u.deepForce stacks.${name});
  coverage = require coverageProblems { stacks = stackNames; locks = lockNames; };
  problems = name: consistency name;
}
