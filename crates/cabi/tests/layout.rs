//! Our `#[repr(C)]` structs against rdma-core's headers (Debian's libibverbs-dev and
//! librdmacm-dev): a C file prints `sizeof`/`offsetof` of every struct and field we fill or
//! read, and each must equal ours. Needs gcc and the headers (CI installs them); their
//! absence fails the test.

use std::process::Command;

#[test]
fn every_struct_and_field_matches_rdma_core_headers() {
    let facts = rdma_cabi::layout::facts();
    assert!(
        facts.len() > 300,
        "the table covers every field we use: {}",
        facts.len()
    );
    let dir = std::env::temp_dir().join(format!("rdma-cabi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &facts {
        src.push_str(&format!("  printf(\"%zu\\n\", (size_t){expr});\n"));
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, src).unwrap();
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("gcc (install gcc, libibverbs-dev and librdmacm-dev)");
    assert!(
        out.status.success(),
        "the C side does not compile against the installed headers:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let theirs: Vec<usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(theirs.len(), facts.len());
    let wrong: Vec<String> = facts
        .iter()
        .zip(&theirs)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((expr, ours), theirs)| format!("{expr}: ours {ours}, rdma-core {theirs}"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
}
