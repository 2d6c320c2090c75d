//! A minimal W3C WebDriver client (blocking, over ureq) for the console's browser test:
//! Debian's `chromedriver` driving headless `chromium`. Just the calls the test makes.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

/// The chromedriver binary Debian's `chromium-driver` installs.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The browser Debian's `chromium` installs.
pub const CHROMIUM: &str = "/usr/bin/chromium";

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A process killed (by its own id) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the browser and its driver are installed; fails the test instead when
/// `ACEMQ_TEST_REQUIRE_BROKER=1` (scripts/test.sh installs them).
pub fn available() -> bool {
    let there =
        std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists();
    assert!(
        there || std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
        "ACEMQ_TEST_REQUIRE_BROKER=1 but {CHROMEDRIVER} or {CHROMIUM} is missing: apt-get install -y chromium chromium-driver"
    );
    there
}

/// Polls `f` until it gives a value or `timeout` passes.
pub fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A free loopback port (bound, then released for the driver to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An HTTP agent that hands back every status instead of failing on 4xx/5xx.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// One headless browser session.
pub struct Browser {
    _driver: Killed,
    base: String,
    session: String,
    agent: ureq::Agent,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Killed(driver);
        let base = format!("http://127.0.0.1:{port}");
        let agent = agent();
        poll(Duration::from_secs(20), "chromedriver to answer", || {
            let mut r = agent.get(&format!("{base}/status")).call().ok()?;
            let v: Value = serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"]
            }
        }}});
        let v = send(&agent, "POST", &format!("{base}/session"), Some(caps));
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        Browser {
            _driver: driver,
            base,
            session,
            agent,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let v = send(&self.agent, method, &url, body);
        assert!(v["value"]["error"].is_null(), "{method} {path}: {v}");
        v["value"].clone()
    }

    /// Opens `url` (waits for the page to load).
    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn js(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// The page's visible text.
    pub fn text(&self) -> String {
        self.js("return document.body ? document.body.innerText : ''")
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Clicks the first element matching `css`.
    pub fn click(&self, css: &str) {
        let e = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        let id = e[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {e}"))
            .to_owned();
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    /// Types `text` into the first element matching `css`.
    pub fn type_into(&self, css: &str, text: &str) {
        let e = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        let id = e[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {e}"))
            .to_owned();
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Writes a PNG screenshot of the page to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        let v = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or(""))
            .expect("a base64 screenshot");
        std::fs::write(path, png).expect("screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.agent.delete(&url).call();
    }
}

fn send(agent: &ureq::Agent, method: &str, url: &str, body: Option<Value>) -> Value {
    let resp = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("DELETE", _) => agent.delete(url).call(),
        (_, b) => agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(b.unwrap_or(json!({})).to_string().as_bytes()),
    };
    let mut resp = resp.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {url}: {e}: {text}"))
}
