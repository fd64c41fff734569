//! The nodelet binary: the node agent, its node-local commands, and (hidden) the per-pod
//! sandbox process, which must be dispatched before any thread exists.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == runtime::builtin::SANDBOX_SUBCOMMAND)
    {
        // The sandbox process: single-threaded, no tokio, as libcontainer requires.
        let Some(dir) = args.get(2) else {
            eprintln!(
                "usage: nodelet {} STATE_DIR",
                runtime::builtin::SANDBOX_SUBCOMMAND
            );
            return ExitCode::from(2);
        };
        nodelet::logging::init_sandbox();
        let code = runtime::builtin::sandbox_main(std::path::Path::new(dir));
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    nodelet::cli::main(args)
}
