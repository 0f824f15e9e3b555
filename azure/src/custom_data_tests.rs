#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use super::*;

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const PROVIDER_ID: &str =
    "azure:///subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/web-1";

/// JSON with quotes and a PEM's line breaks: YAML must carry it unchanged.
const CREDENTIALS: &str =
    "{\"token\":\"t\",\"certificateAuthority\":\"-----BEGIN CERTIFICATE-----\\nMIIB\\n\"}";

fn parse(cloud_config: &str) -> Value {
    let body = cloud_config
        .strip_prefix("#cloud-config\n")
        .expect("starts with #cloud-config");
    serde_saphyr::from_str(body).expect("valid YAML")
}

fn file<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
}

fn commands(doc: &Value) -> Vec<Vec<String>> {
    serde_json::from_value(doc["runcmd"].clone()).unwrap()
}

#[test]
fn rendering_table() {
    // (case, source, the commands cloud-init runs)
    let hostile_url = "https://dl.example/agent?sig=a%2Fb&x='\"$(reboot)\"";
    let cases = [
        (
            "download",
            AgentSource::Download {
                url: "https://dl.example/unbounded-agent".into(),
                sha256: SHA.into(),
            },
            vec![
                vec![
                    INSTALL_SCRIPT.to_owned(),
                    "https://dl.example/unbounded-agent".into(),
                    SHA.into(),
                ],
                vec!["systemctl".into(), "daemon-reload".into()],
                vec![
                    "systemctl".into(),
                    "enable".into(),
                    "--now".into(),
                    AGENT_UNIT.into(),
                ],
            ],
        ),
        (
            "a URL with quotes and shell syntax stays one argument",
            AgentSource::Download {
                url: hostile_url.into(),
                sha256: SHA.into(),
            },
            vec![
                vec![INSTALL_SCRIPT.to_owned(), hostile_url.into(), SHA.into()],
                vec!["systemctl".into(), "daemon-reload".into()],
                vec![
                    "systemctl".into(),
                    "enable".into(),
                    "--now".into(),
                    AGENT_UNIT.into(),
                ],
            ],
        ),
        (
            "preinstalled",
            AgentSource::Preinstalled,
            vec![
                vec!["systemctl".into(), "daemon-reload".into()],
                vec![
                    "systemctl".into(),
                    "enable".into(),
                    "--now".into(),
                    AGENT_UNIT.into(),
                ],
            ],
        ),
    ];
    for (case, source, expected) in cases {
        let launch = AgentLaunch {
            machine: "web-1",
            bootserver_url: Some("http://10.0.0.2:8080"),
            provider_id: PROVIDER_ID,
            source: &source,
            credentials_json: CREDENTIALS,
        };
        let rendered = render(&launch).unwrap();
        let doc = parse(&rendered);
        assert_eq!(commands(&doc), expected, "{case}");
        let env = file(&doc, AGENT_ENV_FILE).expect("environment file");
        assert_eq!(
            env["content"],
            format!(
                "UNBOUNDED_MACHINE=web-1\nUNBOUNDED_BOOTSERVER_URL=http://10.0.0.2:8080\nUNBOUNDED_PROVIDER_ID={PROVIDER_ID}\n"
            ),
            "{case}"
        );
        let credentials =
            file(&doc, unbounded_api::agent::CREDENTIALS_FILE).expect("credentials file");
        assert_eq!(credentials["content"], CREDENTIALS, "{case}");
        assert_eq!(credentials["permissions"], "0600", "{case}");
        let unit = file(&doc, "/etc/systemd/system/unbounded-agent.service").expect("unit");
        let unit = unit["content"].as_str().unwrap();
        assert!(
            unit.contains(&format!("EnvironmentFile={AGENT_ENV_FILE}\n")),
            "{case}: {unit}"
        );
        assert!(
            unit.contains("ExecStart=/usr/local/bin/unbounded-agent\n"),
            "{case}: {unit}"
        );
        let script = file(&doc, INSTALL_SCRIPT);
        match source {
            AgentSource::Download { .. } => {
                let script = script.expect("install script");
                assert_eq!(script["content"], INSTALL_SCRIPT_TEXT, "{case}");
                assert_eq!(script["permissions"], "0755", "{case}");
            }
            AgentSource::Preinstalled => assert!(script.is_none(), "{case}"),
        }
    }
}

#[test]
fn the_install_script_is_valid_sh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("install-agent");
    std::fs::write(&path, INSTALL_SCRIPT_TEXT).unwrap();
    let status = std::process::Command::new("sh")
        .arg("-n")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn custom_data_is_base64_of_the_document() {
    use base64::Engine as _;
    let launch = AgentLaunch {
        machine: "web-1",
        bootserver_url: None,
        provider_id: PROVIDER_ID,
        source: &AgentSource::Preinstalled,
        credentials_json: CREDENTIALS,
    };
    let rendered = render(&launch).unwrap();
    assert!(
        !rendered.contains("UNBOUNDED_BOOTSERVER_URL"),
        "no bootserver, no variable"
    );
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encode(&rendered))
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), rendered);
}

#[test]
fn the_command_line_is_the_assumed_contract() {
    assert_eq!(agent_command(), ["/usr/local/bin/unbounded-agent"]);
}
