# What the runtime stage of containers/Containerfile sets (ENV, USER, WORKDIR, ENTRYPOINT, CMD,
# the passwd/group lines and the COPY destinations), parsed from the file itself so the Nix image
# cannot drift from it: a change there changes the Nix image, or fails `checks.containerfile`.
{ root }:
let
  u = import ./util.nix;
  inherit (u) fail hasPrefix trim;

  file = "containers/Containerfile";
  text = builtins.readFile (root + "/containers/Containerfile");
  # Continuation lines joined, comments dropped.
  lines = builtins.filter (l: l != "" && !(hasPrefix "#" l))
    (map trim (u.splitOn "\n" (builtins.replaceStrings [ "\\\n" ] [ " " ] text)));

  runtimeStart = u.indexOf (l: builtins.match "FROM [^ ]+ AS runtime" l != null) lines;
  runtime =
    if runtimeStart < 0 then fail "${file}: no `FROM ... AS runtime` stage; the Nix image mirrors that stage"
    else u.drop (runtimeStart + 1) lines;

  instr = name: builtins.filter (l: hasPrefix "${name} " l) runtime;
  one = name:
    let xs = instr name;
    in if builtins.length xs != 1 then fail "${file}: the runtime stage must have exactly one ${name} (found ${toString (builtins.length xs)})"
    else u.removePrefix "${name} " (builtins.head xs);

  # ENV K=V K2=V2 ... (values without spaces, as the Containerfile writes them)
  envPairs = builtins.concatMap (l: u.splitOn "[ \t]+" (u.removePrefix "ENV " l)) (instr "ENV");
  env = builtins.listToAttrs (map
    (kv:
      let m = builtins.match "([A-Za-z_][A-Za-z0-9_]*)=(.*)" kv;
      in if m == null then fail "${file}: cannot read ENV entry '${kv}' (expected KEY=VALUE)"
      else { name = builtins.elemAt m 0; value = builtins.elemAt m 1; })
    envPairs);

  passwdLine = kind:
    let
      hits = builtins.concatMap
        (l:
          let m = builtins.match ".*echo '([^']+)' >> /etc/${kind}.*" l;
          in if m == null then [ ] else [ (builtins.head m) ])
        (instr "RUN");
    in
    if hits == [ ] then fail "${file}: the runtime stage writes no /etc/${kind} line" else builtins.head hits;

  copies = map
    (l:
      let words = u.splitOn "[ \t]+" (u.removePrefix "COPY " l);
          from = builtins.filter (w: hasPrefix "--from=" w) words;
          rest = builtins.filter (w: !(hasPrefix "--" w)) words;
      in {
        from = if from == [ ] then null else u.removePrefix "--from=" (builtins.head from);
        source = builtins.head rest;
        dest = builtins.elemAt rest (builtins.length rest - 1);
      })
    (instr "COPY");

  entrypoint = builtins.fromJSON (one "ENTRYPOINT");
  venvPython = builtins.head entrypoint;
  dirOf2 = p: builtins.dirOf (builtins.dirOf p);
in
{
  inherit file env copies entrypoint text;
  cmd = builtins.fromJSON (one "CMD");
  user = one "USER";
  workdir = one "WORKDIR";
  passwd = passwdLine "passwd";
  group = passwdLine "group";
  # /opt/venv from ENTRYPOINT ["/opt/venv/bin/python", ...]; /opt/speclock from ENV SPECLOCK_HOME.
  venv = dirOf2 venvPython;
  home = env.SPECLOCK_HOME or (fail "${file}: the runtime stage sets no ENV SPECLOCK_HOME");
  copyDestinations = map (c: c.dest) copies;
}
