# A JSON syntax check on builtins alone: builtins.fromJSON's parse errors do not say which file
# failed (and cannot be caught), so a lock is checked first and a bad one is reported by name
# and line. Returns null when `text` is valid JSON, else { line; problem; }.
text:
let
  tokenRe = "(\"([^\"\\\\]|\\\\.)*\"|-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?|true|false|null|[][{}:,])";
  # [gap, [token captures], gap, [token captures], ..., gap]
  parts = builtins.split tokenRe text;
  n = builtins.length parts;
  gapOk = g: builtins.match "[ \t\r\n]*" g != null;
  kind = tok:
    let c = builtins.substring 0 1 tok;
    in if c == "\"" then "string" else if builtins.elem c [ "{" "}" "[" "]" ":" "," ] then c else "scalar";
  step = st: i:
    if st ? err then st
    else
      let p = builtins.elemAt parts i;
      in
      if builtins.isString p then (if gapOk p then st else st // { err = i; problem = "unexpected text"; })
      else
        let
          tok = builtins.head p;
          k = kind tok;
          top = if st.stack == [ ] then null else builtins.head st.stack;
          pop = builtins.tail st.stack;
          afterValue = stack: { inherit stack; expect = if stack == [ ] then "end" else "separator"; };
          bad = st // { err = i; problem = "unexpected ${builtins.substring 0 40 tok} (expected ${st.expect})"; };
        in
        if st.expect == "value" || st.expect == "value or ]" then
          (if k == "string" || k == "scalar" then afterValue st.stack
          else if k == "{" then { stack = [ "object" ] ++ st.stack; expect = "key or }"; }
          else if k == "[" then { stack = [ "array" ] ++ st.stack; expect = "value or ]"; }
          else if k == "]" && st.expect == "value or ]" then afterValue pop
          else bad)
        else if st.expect == "key or }" || st.expect == "key" then
          (if k == "string" then { inherit (st) stack; expect = ":"; }
          else if k == "}" && st.expect == "key or }" then afterValue pop
          else bad)
        else if st.expect == ":" then (if k == ":" then { inherit (st) stack; expect = "value"; } else bad)
        else if st.expect == "separator" then
          (if k == "," then { inherit (st) stack; expect = if top == "object" then "key" else "value"; }
          else if k == "}" && top == "object" then afterValue pop
          else if k == "]" && top == "array" then afterValue pop
          else bad)
        else bad;
  final = builtins.foldl' step { stack = [ ]; expect = "value"; } (builtins.genList (i: i) n);
  # Line of part i: newlines in everything before it, plus one.
  lineOf = i:
    let
      before = builtins.concatStringsSep "" (builtins.genList
        (j: let p = builtins.elemAt parts j; in if builtins.isString p then p else builtins.head p) i);
    in
    1 + (builtins.length (builtins.split "\n" before) - 1) / 2;
in
if final ? err then { line = lineOf final.err; inherit (final) problem; }
else if final.expect != "end" then { line = lineOf n; problem = "unexpected end of file (expected ${final.expect})"; }
else null
