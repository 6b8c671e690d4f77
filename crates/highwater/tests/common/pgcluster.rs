//! A throw-away PostgreSQL cluster of one test's own, on 127.0.0.1 and a
//! free port, stopped and removed on drop: for the tests that must stop the
//! server (a state store lost mid-run) or that need it to check passwords
//! (the shared test cluster trusts every connection and is never stopped).
//! Issue 20.

use std::path::PathBuf;
use std::process::Command;

pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl PgCluster {
    /// A cluster that trusts every connection.
    pub fn start() -> PgCluster {
        PgCluster::init(None)
    }

    /// A cluster that checks passwords (scram-sha-256); the superuser
    /// `postgres` has `superuser_password`.
    pub fn start_with_password(superuser_password: &str) -> PgCluster {
        PgCluster::init(Some(superuser_password))
    }

    fn init(password: Option<&str>) -> PgCluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is not installed (/usr/lib/postgresql); the test needs a real server: apt-get install postgresql")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .max_by_key(|b| {
                b.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("no initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = PgCluster { dir, bin, port };
        let mut initdb = c.as_server("initdb");
        initdb
            .arg("-D")
            .arg(c.dir.path().join("data"))
            .args(["-U", "postgres", "-E", "UTF8"]);
        match password {
            None => {
                initdb.arg("--auth=trust");
            }
            Some(pw) => {
                let pwfile = c.dir.path().join("pw");
                std::fs::write(&pwfile, pw).unwrap();
                initdb
                    .arg("--auth=scram-sha-256")
                    .arg(format!("--pwfile={}", pwfile.display()));
            }
        }
        if root() {
            // initdb and postgres refuse to run as root.
            let o = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(c.dir.path())
                .status()
                .unwrap();
            assert!(o.success(), "chown to postgres");
        }
        let o = initdb.output().unwrap();
        assert!(
            o.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        c.start_again();
        c
    }

    fn as_server(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    /// The superuser's URL on a cluster that trusts connections.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// `user`'s URL with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname=postgres",
            self.port
        )
    }

    fn pg_ctl(&self, args: &[&str]) {
        let o = self
            .as_server("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "pg_ctl {args:?}: {}{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    pub fn start_again(&self) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        self.pg_ctl(&["-w", "-o", &opts, "start"]);
    }

    /// The server is gone at once, as in a crash: no connection is closed
    /// cleanly.
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["-w", "-m", "immediate", "stop"]);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .as_server("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// Whether this test runs as root (then the server runs as `postgres`).
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
