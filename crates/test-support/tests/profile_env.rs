//! `CREATEOS_EMULATOR_PROFILE` chooses the profile of the emulators the test support starts
//! when a test names none. One test in its own binary: it sets the variable.

use createos_test_support::{unlimited, with_emulator, EmulatorOptions, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_chooses_the_profile_a_test_does_not_name() {
    // The only test of this binary: nothing else reads the environment meanwhile.
    std::env::set_var("CREATEOS_EMULATOR_PROFILE", "documented");
    with_emulator(unlimited(), |emu| async move { assert_eq!(emu.profile(), Profile::Documented) }).await;
    let full = EmulatorOptions { profile: Some(Profile::Full), ..unlimited() };
    with_emulator(full, |emu| async move { assert_eq!(emu.profile(), Profile::Full, "asked for explicitly") }).await;
    std::env::set_var("CREATEOS_EMULATOR_PROFILE", "full");
    with_emulator(unlimited(), |emu| async move { assert_eq!(emu.profile(), Profile::Full) }).await;
    std::env::remove_var("CREATEOS_EMULATOR_PROFILE");
    with_emulator(unlimited(), |emu| async move { assert_eq!(emu.profile(), Profile::Full, "the default") }).await;
}
