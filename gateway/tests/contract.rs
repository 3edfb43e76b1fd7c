//! The generated contract files are current: contract/errors.md from the error catalog,
//! contract/settings.md from the settings. `EMBEDFLEET_UPDATE_CONTRACT=1 cargo test` rewrites
//! them.

mod common;

fn current(file: &str, made: &str) {
    let path = common::manifest_dir().join("contract").join(file);
    if std::env::var_os("EMBEDFLEET_UPDATE_CONTRACT").is_some() {
        std::fs::write(&path, made).expect("contract/ is writable");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == made,
        "contract/{file} is stale: run EMBEDFLEET_UPDATE_CONTRACT=1 cargo test"
    );
}

#[test]
fn the_error_catalog_table_is_current() {
    current("errors.md", &embedfleet_gateway::api::errors::markdown());
}

#[test]
fn the_settings_table_is_current() {
    current("settings.md", &embedfleet_gateway::settings::markdown());
}
