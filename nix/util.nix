# Small string and list helpers on builtins alone: the pins and checks must evaluate with no
# nixpkgs (nixpkgs' lib is not available offline).
rec {
  fail = msg: throw "speclock: ${msg}";

  hasPrefix = prefix: s: builtins.substring 0 (builtins.stringLength prefix) s == prefix;

  hasSuffix = suffix: s:
    let
      l = builtins.stringLength s;
      k = builtins.stringLength suffix;
    in
    l >= k && builtins.substring (l - k) k s == suffix;

  removeSuffix = suffix: s:
    if hasSuffix suffix s then builtins.substring 0 (builtins.stringLength s - builtins.stringLength suffix) s else s;

  removePrefix = prefix: s:
    if hasPrefix prefix s then builtins.substring (builtins.stringLength prefix) (builtins.stringLength s) s else s;

  # The strings of builtins.split's result (the captures between them are lists).
  splitOn = regex: s: builtins.filter builtins.isString (builtins.split regex s);

  concatStringsSep = builtins.concatStringsSep;

  upper = [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" ];
  lower = [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" ];
  toLower = builtins.replaceStrings upper lower;

  # PEP 503 name normalization, as speclock.core.names.normalize does it.
  normalizeName = name: toLower (concatStringsSep "-" (splitOn "[-_.]+" name));

  listToAttrsBy = key: xs: builtins.listToAttrs (map (x: { name = x.${key}; value = x; }) xs);

  # Strip leading/trailing spaces and tabs of one line.
  trim = s:
    let m = builtins.match "[ \t]*(.*[^ \t])[ \t]*" s;
    in if m == null then "" else builtins.head m;

  # Index of the first element satisfying pred, or -1.
  indexOf = pred: xs:
    let
      go = i: if i >= builtins.length xs then -1 else if pred (builtins.elemAt xs i) then i else go (i + 1);
    in
    go 0;

  drop = n: xs: builtins.genList (i: builtins.elemAt xs (i + n)) (builtins.length xs - n);

  # Force a value completely; returns `v` (so a check can depend on everything being valid).
  deepForce = v: builtins.deepSeq v v;

  # UTC "YYYY-MM-DDTHH:MM:SSZ" of a Unix time (days-to-civil, proleptic Gregorian), as
  # speclock.build.labels.labels_for writes org.opencontainers.image.created.
  isoUtc = epoch:
    let
      pad = n: if n < 10 then "0${toString n}" else toString n;
      days = epoch / 86400;
      secs = epoch - days * 86400;
      z = days + 719468;
      era = z / 146097;
      doe = z - era * 146097;
      yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
      doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
      mp = (5 * doy + 2) / 153;
      d = doy - (153 * mp + 2) / 5 + 1;
      m = if mp < 10 then mp + 3 else mp - 9;
      y = yoe + era * 400 + (if m <= 2 then 1 else 0);
    in
    "${toString y}-${pad m}-${pad d}T${pad (secs / 3600)}:${pad (secs / 60 - (secs / 3600) * 60)}:${pad (secs - (secs / 60) * 60)}Z";
}
