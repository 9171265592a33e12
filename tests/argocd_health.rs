//! The Argo CD health check of RolloutStrategy (`config/argocd/rolloutstrategy-health.lua`),
//! run by a real Lua interpreter the way Argo CD runs it: the object as the global `obj`, the
//! script's chunk returning `hs`. Each fixture under `tests/fixtures/argocd/` is
//! `{expected: {status, message}, object}`: the health status the script must return, and a
//! substring its message must contain. Pure: no cluster needed, but a Lua interpreter is
//! (`apt-get install lua5.4`; `hack/test.sh` installs it). Without one the tests fail, never
//! skip.
//!
//! Argo CD runs health scripts in gopher-lua (Lua 5.1) with only the base, table and a safe
//! os library opened: the driver below gives the script no more than that (no string or math
//! library, no string methods), so a script that passes here does not fail there for a
//! function it lacks. Where `lua5.1` is installed as well, every fixture also runs under it.

use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const SCRIPT: &str = "config/argocd/rolloutstrategy-health.lua";
const CM_PATCH: &str = "config/argocd/argocd-cm-patch.yaml";
const CM_KEY: &str = "resource.customizations.health.ballast.dev_RolloutStrategy";
const FIXTURES: &str = "tests/fixtures/argocd";

/// The health statuses Argo CD accepts from a health script (anything else becomes Unknown).
const ARGO_STATUSES: [&str; 6] = [
    "Healthy",
    "Progressing",
    "Degraded",
    "Suspended",
    "Missing",
    "Unknown",
];

/// Every phase of `status.phase` (the manager's own list, so a new phase needs a fixture here
/// before this test passes); each must appear in at least one fixture.
const PHASES: [&str; 10] = ballast::metrics::ROLLOUT_PHASES;

/// Reads `obj` from the generated literal, runs the health script at `arg[1]` in an environment
/// like Argo CD's and prints `status`, a newline and `message`. Runs on Lua 5.1 to 5.4.
const DRIVER: &str = r#"
local obj = __OBJECT__
local file = assert(io.open(arg[1], "rb"))
local source = file:read("*a")
file:close()

-- Argo CD (util/lua/lua.go) opens only the base, package, table and a safe os library.
local env = { obj = obj, table = table, os = { time = os.time, date = os.date } }
for _, name in ipairs({ "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall",
    "print", "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring",
    "type", "unpack", "xpcall" }) do
  env[name] = _G[name]
end
env._G = env

local chunk, err
if setfenv then
  chunk, err = loadstring(source, "=health.lua")
  if chunk then setfenv(chunk, env) end
else
  chunk, err = load(source, "=health.lua", "t", env)
end
if not chunk then
  io.stderr:write("the health script does not compile: ", tostring(err), "\n")
  os.exit(2)
end

-- Without the string library a string has no methods (gopher-lua sets them up there).
local stringMeta = getmetatable("")
debug.setmetatable("", nil)
local ok, hs = pcall(chunk)
debug.setmetatable("", stringMeta)
if not ok then
  io.stderr:write("the health script failed: ", tostring(hs), "\n")
  os.exit(3)
end
if type(hs) ~= "table" then
  io.stderr:write("the health script returned a ", type(hs), ", not a table\n")
  os.exit(4)
end
if type(hs.status) ~= "string" or type(hs.message) ~= "string" then
  io.stderr:write("hs.status and hs.message must be strings, got ", type(hs.status), " and ",
    type(hs.message), "\n")
  os.exit(5)
end
io.write(hs.status, "\n", hs.message)
"#;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The interpreters to run with: `lua5.4` (else `lua`), required, and `lua5.1` if present
/// (the language gopher-lua implements). Panics, failing the test, when neither of the first
/// two is installed.
fn interpreters() -> &'static [(String, String)] {
    static FOUND: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let version = |cmd: &str| -> Option<String> {
            let out = Command::new(cmd).arg("-v").output().ok()?;
            out.status.success().then(|| {
                let text = [out.stdout, out.stderr].concat();
                String::from_utf8_lossy(&text).trim().to_string()
            })
        };
        let main = ["lua5.4", "lua"]
            .into_iter()
            .find_map(|cmd| version(cmd).map(|v| (cmd.to_string(), v)));
        let Some(main) = main else {
            panic!(
                "no Lua interpreter found (tried lua5.4 and lua on PATH): install one with \
                 `apt-get install lua5.4` (hack/test.sh does so when it is missing)"
            );
        };
        let mut all = vec![main];
        if let Some(v) = version("lua5.1")
            && !all.iter().any(|(_, seen)| *seen == v)
        {
            all.push(("lua5.1".to_string(), v));
        }
        all
    })
}

/// A Lua string literal holding exactly the bytes of `s`. Quotes, backslashes and control
/// characters are escaped (decimal `\ddd`, which every Lua version reads, always three digits
/// so a following digit is not taken into it); other bytes, UTF-8 included, stand as they are.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                write!(out, "\\{:03}", c as u32).expect("writing to a String");
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A Lua expression for a JSON value, as Argo CD hands the object over: objects and arrays
/// become tables, `null` becomes nil (an absent key), numbers stay numbers. Keys are always
/// written `["key"]`, so reserved words and keys like `ballast.dev/approve` need no care.
fn lua_value(v: &Value) -> String {
    match v {
        Value::Null => "nil".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            // Display of an f64 has no exponent and reads back exactly; JSON has no NaN or
            // infinity.
            (None, None, Some(f)) => format!("{f:?}"),
            _ => unreachable!("a JSON number is an i64, a u64 or an f64"),
        },
        Value::String(s) => lua_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(lua_value).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_value(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
    }
}

/// Runs a Lua program given on standard input with `args`; returns stdout or a description of
/// the failure.
fn run_lua(lua: &str, program: &str, args: &[&Path]) -> Result<String, String> {
    let mut child = Command::new(lua)
        .arg("-")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {lua}: {e}"))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(program.as_bytes())
        .map_err(|e| format!("cannot write the program to {lua}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{lua} did not finish: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{lua} exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{lua} printed no UTF-8: {e}"))
}

/// The health check's `(status, message)` for `object`, as `lua` computes it.
fn health(lua: &str, object: &Value) -> Result<(String, String), String> {
    let program = DRIVER.replace("__OBJECT__", &lua_value(object));
    let out = run_lua(lua, &program, &[&root().join(SCRIPT)])?;
    let (status, message) = out
        .split_once('\n')
        .ok_or_else(|| format!("the driver printed no status line: {out:?}"))?;
    Ok((status.to_string(), message.to_string()))
}

fn fixtures() -> Vec<PathBuf> {
    let dir = root().join(FIXTURES);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {FIXTURES}");
    files
}

#[test]
fn every_fixture_gets_its_expected_health() {
    let mut problems = Vec::new();
    let mut phases = BTreeSet::new();
    for path in fixtures() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).expect("a readable fixture");
        let fixture: Value = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{FIXTURES}/{name} is not YAML: {e}"));
        let want_status = fixture["expected"]["status"]
            .as_str()
            .unwrap_or_else(|| panic!("{FIXTURES}/{name}: expected.status must be a string"));
        let want_message = fixture["expected"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{FIXTURES}/{name}: expected.message must be a string"));
        assert!(
            ARGO_STATUSES.contains(&want_status),
            "{FIXTURES}/{name}: {want_status} is not an Argo CD health status"
        );
        assert!(
            !want_message.is_empty(),
            "{FIXTURES}/{name}: expected.message must not be empty"
        );
        let object = &fixture["object"];
        assert_eq!(
            object["kind"], "RolloutStrategy",
            "{FIXTURES}/{name}: object must be a RolloutStrategy"
        );
        // The object must read as this crate's RolloutStrategy: no misspelt phase or enum.
        if let Err(e) = serde_json::from_value::<ballast::api::rollout_strategy::RolloutStrategy>(
            object.clone(),
        ) {
            problems.push(format!("{name}: not a valid RolloutStrategy: {e}"));
        }
        if let Some(phase) = object["status"]["phase"].as_str() {
            phases.insert(phase.to_string());
        }
        for (lua, _) in interpreters() {
            match health(lua, object) {
                Ok((status, message)) => {
                    println!("{name} ({lua}): {status}: {message}");
                    if status != want_status || !message.contains(want_message) {
                        problems.push(format!(
                            "{name} ({lua}): got {status} {message:?}, want {want_status} with a \
                             message containing {want_message:?}"
                        ));
                    }
                }
                Err(e) => problems.push(format!("{name} ({lua}): {e}")),
            }
        }
    }
    let missing: Vec<&str> = PHASES
        .iter()
        .copied()
        .filter(|p| !phases.contains(*p))
        .collect();
    if !missing.is_empty() {
        problems.push(format!("no fixture in phase {missing:?}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_argocd_cm_patch_holds_the_same_script() {
    let script = std::fs::read_to_string(root().join(SCRIPT)).expect("the health script");
    let patch: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join(CM_PATCH)).expect("the argocd-cm patch"),
    )
    .expect("the argocd-cm patch is YAML");
    assert_eq!(patch["kind"], "ConfigMap");
    assert_eq!(patch["metadata"]["name"], "argocd-cm");
    let embedded = patch["data"][CM_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("{CM_PATCH} has no data key {CM_KEY}"));
    assert!(
        embedded == script,
        "{CM_PATCH} ({CM_KEY}) differs from {SCRIPT}: keep them identical (indent the .lua file \
         by four spaces under the key)"
    );
    assert!(
        script.trim_end().ends_with("return hs"),
        "Argo CD takes the chunk's return value: {SCRIPT} must end with `return hs`"
    );
}

#[test]
fn lua_literals_carry_every_string_exactly() {
    let tricky = "quote \" backslash \\ newline \n tab \t nul \0 del \u{7f} digit after \u{1}9 \
                  ]] [[ end -- ü ✓ 日本";
    let value = serde_json::json!({"end": tricky, "ballast.dev/approve": [1, -2, 0.5, true]});
    let program = format!(
        "local v = {}\nio.write(v[\"end\"], \"|\", #v[\"ballast.dev/approve\"], \"|\", \
         tostring(v[\"ballast.dev/approve\"][3]))",
        lua_value(&value)
    );
    for (lua, _) in interpreters() {
        let out = run_lua(lua, &program, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, format!("{tricky}|4|0.5"), "{lua}");
    }
}
