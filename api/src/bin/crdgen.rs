//! Writes the CRDs into `deploy/crds/` (or the directory given as the first argument), the
//! Cluster API kinds' CRDs into `cluster-api/crds/` beside it, and the resources' reference
//! page into `docs/reference.md` (or the file given as the second).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds"));
    let capi_dir = dir.parent().map_or_else(
        || PathBuf::from("cluster-api/crds"),
        |d| d.join("cluster-api/crds"),
    );
    for (dir, rendered) in [
        (&dir, unbounded_api::crds::render_all()),
        (&capi_dir, unbounded_api::crds::render_cluster_api()),
    ] {
        let files = match rendered {
            Ok(files) => files,
            Err(e) => {
                eprintln!("crdgen: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("crdgen: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        for (name, yaml) in files {
            let path = dir.join(&name);
            if let Err(e) = std::fs::write(&path, yaml) {
                eprintln!("crdgen: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", path.display());
        }
    }
    let reference = std::env::args_os()
        .nth(2)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md"));
    if let Err(e) = std::fs::write(&reference, unbounded_api::reference::render()) {
        eprintln!("crdgen: writing {}: {e}", reference.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", reference.display());
    ExitCode::SUCCESS
}
