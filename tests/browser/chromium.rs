//! Headless Chromium with WebGPU on SwiftShader (Vulkan on the CPU), driven over the DevTools
//! protocol: open a page, wait until it has written its result (or an error), take a screenshot.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How to install Chromium where it is missing.
pub const INSTALL_CHROMIUM: &str = "install Chromium (Debian: apt-get install -y chromium), or point KILN_CHROMIUM at a Chromium binary";

/// Flags for WebGPU on SwiftShader in a headless, offline Chromium.
const FLAGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--enable-logging=stderr",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1000,1100",
];

/// The Chromium binary: `KILN_CHROMIUM`, else the first of `chromium`, `chromium-browser`,
/// `google-chrome` on `PATH`.
pub fn find(path_var: Option<&std::ffi::OsStr>, explicit: Option<&str>) -> Result<PathBuf, String> {
    if let Some(explicit) = explicit {
        let path = PathBuf::from(explicit);
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!("KILN_CHROMIUM={explicit} is not a file: {INSTALL_CHROMIUM}")),
        };
    }
    let dirs: Vec<PathBuf> = path_var.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("Chromium not found on PATH: {INSTALL_CHROMIUM}"))
}

/// A running headless Chromium (killed on drop) with a DevTools session on one page.
pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `binary` with its stderr (the console, with `--enable-logging=stderr`) in `log`
    /// and opens a blank page.
    pub fn start(binary: &Path, log: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(binary)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--remote-debugging-address=127.0.0.1")
            .arg("--remote-debugging-port=0")
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary.display()));
        // Chromium writes its port and the browser's socket path once it listens.
        let active = profile.path().join("DevToolsActivePort");
        let began = Instant::now();
        let text = loop {
            match std::fs::read_to_string(&active) {
                Ok(text) if text.lines().count() >= 2 => break text,
                _ if began.elapsed() > Duration::from_secs(60) => {
                    panic!("Chromium did not open its DevTools port within 60 s; its log: {}", log.display())
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let mut lines = text.lines();
        let (port, path) = (lines.next().unwrap().trim(), lines.next().unwrap().trim());
        let (socket, _) = tungstenite::connect(format!("ws://127.0.0.1:{port}{path}")).expect("DevTools websocket");
        let mut browser = Browser { child, socket, session: String::new(), next_id: 0, _profile: profile };
        let target = browser.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = browser.call(None, "Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }));
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        browser
    }

    /// Sends one DevTools command (to the page's session unless `browser_level`) and returns its
    /// result, skipping the events that arrive meanwhile.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.socket.send(Message::text(message.to_string())).expect("DevTools send");
        loop {
            let reply = self.socket.read().expect("DevTools read");
            let Message::Text(text) = reply else { continue };
            let reply: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if reply["id"].as_u64() == Some(id) {
                assert!(reply.get("error").is_none(), "DevTools {method}: {}", reply["error"]);
                return reply["result"].clone();
            }
        }
    }

    fn page_call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call(Some(&session), method, params)
    }

    /// Navigates the page to `url`.
    pub fn open(&mut self, url: &str) {
        self.page_call("Page.enable", json!({}));
        self.page_call("Page.navigate", json!({ "url": url }));
    }

    /// The value of the JavaScript expression `expression` in the page (JSON).
    pub fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.page_call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }));
        result["result"]["value"].clone()
    }

    /// Polls the page until `expression` is neither null nor undefined, or `timeout` passes.
    pub fn wait_for(&mut self, expression: &str, timeout: Duration) -> Option<Value> {
        let began = Instant::now();
        while began.elapsed() < timeout {
            let value = self.evaluate(expression);
            if !value.is_null() {
                return Some(value);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        None
    }

    /// A PNG screenshot of the page, written to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.page_call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true }));
        let png = base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
