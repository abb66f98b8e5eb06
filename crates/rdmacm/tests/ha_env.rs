//! `RDMACM_HA` and `RDMACM_HA_RETURN` read by `Cma::new` (one test: the process
//! environment is shared).

use rdmacm::cm::{CmId, Cma, CmaConfig, EventChannel, HaPolicy, PortSpace, HA_ENV, HA_RETURN_ENV};

fn policy_of_new_id() -> HaPolicy {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    CmId::new(&ch, PortSpace::Tcp).unwrap().ha_policy()
}

#[test]
fn rdmacm_ha_sets_the_default_policy() {
    assert_eq!(HA_ENV, "RDMACM_HA");
    std::env::remove_var(HA_ENV);
    assert_eq!(policy_of_new_id(), HaPolicy::Notify, "unset: notify");
    for (v, want) in [
        ("align", HaPolicy::Align),
        ("ALIGN", HaPolicy::Align),
        (" notify ", HaPolicy::Notify),
        ("Migrate", HaPolicy::Migrate),
        ("", HaPolicy::Notify),
    ] {
        std::env::set_var(HA_ENV, v);
        assert_eq!(CmaConfig::from_env().unwrap().ha, want, "{v:?}");
        assert_eq!(policy_of_new_id(), want, "{v:?}");
    }
    for (v, errno) in [
        ("alignn", libc::EINVAL),
        ("notify,align", libc::EINVAL),
        ("migrated", libc::EINVAL),
    ] {
        std::env::set_var(HA_ENV, v);
        let e = Cma::new().unwrap_err();
        assert_eq!(e.errno(), errno, "{v:?}: {e}");
        assert!(e.to_string().contains("RDMACM_HA"), "{v:?}: {e}");
    }
    let e = Cma::new().unwrap_err();
    assert!(e.to_string().contains("notify, align or migrate"), "{e}");
    std::env::remove_var(HA_ENV);
    assert!(Cma::new().is_ok());

    // RDMACM_HA_RETURN: stay or return (the default).
    assert!(!CmaConfig::from_env().unwrap().ha_stay);
    for (v, stay) in [("stay", true), (" Return ", false), ("", false)] {
        std::env::set_var(HA_RETURN_ENV, v);
        assert_eq!(CmaConfig::from_env().unwrap().ha_stay, stay, "{v:?}");
    }
    std::env::set_var(HA_RETURN_ENV, "linger");
    let e = Cma::new().unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains("RDMACM_HA_RETURN"), "{e}");
    std::env::remove_var(HA_RETURN_ENV);
}
