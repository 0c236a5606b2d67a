use super::*;
#[test]
fn placeholder() {
    let _t: LockTable<u8, ()> = LockTable::new();
}
